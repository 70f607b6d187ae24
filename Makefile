# dayzero: the two commands a newcomer needs are `make test` and `make run` (README.md).
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"

.PHONY: all deps build run test unit asan tsan fuzz bench format clean

all: build

deps:
	bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD)

# Serves dayzero's own demo model (models/demo, docs/demo_model.md: the default when no --model is
# given) on http://127.0.0.1:$(PORT); RUN_ARGS adds flags, e.g. RUN_ARGS="--model DIR".
PORT ?= 8000
RUN_ARGS ?=
run: build
	$(BUILD)/src/dayzero/cli/dayzero serve --port $(PORT) $(RUN_ARGS)

# Everything CI runs: the ASan+UBSan unit tests and the serving soak against the ASan+UBSan
# `dayzero` (about a minute), the bounded fuzz runs, then the full suite. The sanitizer builds keep
# line tables only (-g1) and the fuzz build is -O1 with asserts on: CI must stay under 45 minutes
# on 2 cores, and these builds dominate it.
test: build asan fuzz
	ctest --test-dir $(BUILD) --output-on-failure -j 2

unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j 2 -L unit

asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
	  -DDZ_SANITIZE=ON -DDZ_BENCH=OFF
	cmake --build $(ASAN_BUILD)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j 2 -L unit
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -L soak

# Not part of `make test`: the serving soak against a ThreadSanitizer build of `dayzero` alone
# (about 10 minutes of build on 2 cores, then a minute of soak).
tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DDZ_TSAN=ON -DDZ_BENCH=OFF
	cmake --build $(TSAN_BUILD) --target dayzero
	ctest --test-dir $(TSAN_BUILD) --output-on-failure -L soak

fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DDZ_FUZZ=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DDZ_FUZZ_SECONDS=$(FUZZ_SECONDS)
	cmake --build $(FUZZ_BUILD)
	ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j 2 -L fuzz

# The whole benchmark suite (limits, operators, decode/prefill sweeps, PyTorch peer; ~10 min on a
# quiet machine), its JSON in BENCH_OUT and the table of docs/performance.md on stdout.
BENCH_OUT ?= bench-results
bench: build
	bash bench/run_suite.sh $(BUILD)/src/dayzero/cli/dayzero $(BENCH_OUT)
	/usr/bin/python3 bench/suite_report.py $(BENCH_OUT)

format:
	find src bench fuzz tests -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
