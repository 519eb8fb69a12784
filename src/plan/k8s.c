/*
 * k8s.c — `memwall plan --emit k8s`: the resources of one node's pod for a plan.
 *
 * Memory: the plan's host bytes per node, plus 4 GiB per GPU for what every rank's process
 * needs beside its state (CUDA context mirror, framework, data loader), plus /dev/shm, which
 * Kubernetes charges to the container when it is a memory-backed emptyDir. Requests carry
 * 10% headroom, limits 25%. /dev/shm is 1 GiB per GPU (NCCL's intra-node buffers and the
 * data loader's queues), at least 2 GiB. The NVMe tier becomes ephemeral storage (same
 * headroom) — for a real deployment a local PersistentVolume on NVMe is better, and the
 * comment says so.
 */
#include "memwall/plan.h"
#include "memwall/common.h"

#include <math.h>

#define GIB 1073741824.0

static unsigned long long gib_up(double bytes) { return (unsigned long long)ceil(bytes / GIB); }

void mw_plan_emit_k8s(const struct mw_plan_result *r, const struct mw_layout *l,
                      const struct mw_hw *hw, FILE *f)
{
    const uint64_t gpn = MW_MIN(l->gpus_per_node ? l->gpus_per_node : (hw ? hw->gpus_per_node : 8),
                                l->gpus ? l->gpus : 1);
    const double shm = fmax(2 * GIB, (double)gpn * GIB);
    const double mem = (double)r->host_node + (double)gpn * 4 * GIB + shm;
    const double nvme = (double)r->nvme_node;
    fprintf(f, "# memwall plan: one pod per node, %llu GPU(s) each; host state %.1f GiB per node",
            (unsigned long long)gpn, (double)r->host_node / GIB);
    if (nvme > 0) fprintf(f, ", NVMe tier %.1f GiB per node", nvme / GIB);
    fprintf(f, "\n");
    if (nvme > 0)
        fprintf(f, "# the NVMe tier as ephemeral storage must sit on local NVMe (a local PV is safer)\n");
    fprintf(f, "resources:\n  requests:\n    memory: \"%lluGi\"\n    nvidia.com/gpu: \"%llu\"\n",
            gib_up(mem * 1.10), (unsigned long long)gpn);
    if (nvme > 0) fprintf(f, "    ephemeral-storage: \"%lluGi\"\n", gib_up(nvme * 1.10));
    fprintf(f, "  limits:\n    memory: \"%lluGi\"\n    nvidia.com/gpu: \"%llu\"\n",
            gib_up(mem * 1.25), (unsigned long long)gpn);
    if (nvme > 0) fprintf(f, "    ephemeral-storage: \"%lluGi\"\n", gib_up(nvme * 1.25));
    fprintf(f, "volumeMounts:\n  - name: dshm\n    mountPath: /dev/shm\n");
    fprintf(f, "volumes:\n  - name: dshm\n    emptyDir:\n      medium: Memory\n      sizeLimit: \"%lluGi\"\n",
            gib_up(shm));
}
