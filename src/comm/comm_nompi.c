/*
 * comm_nompi.c — the answer "no MPI table" for a build without MPI. CMake compiles this file
 * instead of src/mpi/ when it does not find MPI (and never together with it), so comm.c asks
 * mw_comm_mpi_iface_() at run time instead of testing MEMWALL_HAVE_MPI; why a second
 * definition and not a weak symbol: the design comment of comm_impl.h.
 */
#include <stddef.h>

#include "comm/comm_impl.h"

const struct mw_comm_iface *mw_comm_mpi_iface_(void) { return NULL; }
