# Thin wrapper over CMake/CTest. `make demo` and `make test` install missing dependencies first.
BUILD ?= build
CC ?= cc
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test demo demo-mpi bench clean asan clang fuzz

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# ASan+UBSan build and test run (what .ci/run does too).
asan: deps
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DMEMWALL_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# Build with clang as well (warnings are errors).
clang: deps
	CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release
	cmake --build build-clang -j $(JOBS)

# libFuzzer harnesses (fuzz/README.md): each runs FUZZ_SECONDS on a copy of its committed corpus.
FUZZ_SECONDS ?= 60
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMWALL_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) --target memwall_fuzzers
	bash fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

demo: deps
	$(MAKE) build
	bash scripts/demo.sh $(BUILD)/memwall

# The demo on 2 MPI ranks with ZeRO-2 and a per-rank report (docs/mpi.md).
demo-mpi: deps
	$(MAKE) build
	bash scripts/demo_mpi.sh $(BUILD)/memwall

bench: deps
	$(MAKE) build
	bash bench/run_all.sh $(BUILD)/memwall

clean:
	rm -rf build build-asan build-clang build-fuzz build-cuda build-gpu
