# Sieve: the two commands are `make serve` and `make test`. Both install what they need first
# (scripts/setup: Debian packages as root or with sudo; `make serve` only the build's).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup setup-build build test test-sanitize serve clean format gpu-check

setup:
	bash scripts/setup

setup-build:
	bash scripts/setup --build

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: setup build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The CPU build and its tests under AddressSanitizer and UndefinedBehaviorSanitizer (a build of
# its own in $(BUILD)-sanitize: on 2 cores ~26 minutes to build, ~14 to run the tests).
# Leak checks are off here; ASAN_OPTIONS=detect_leaks=1 in a manual ctest run turns them on.
test-sanitize: setup
	cmake -S . -B $(BUILD)-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIEVE_CUDA=OFF \
	  -DSIEVE_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build $(BUILD)-sanitize -j $(JOBS)
	cd $(BUILD)-sanitize && ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) --timeout 1800

# Builds only the `sieve` binary: serving needs none of the tests. `make serve SPEC=eagle3` adds the
# bundled model's EAGLE3 draft (models/minimax-m3-tiny-eagle3), `SPEC=ngram` prompt lookup.
SPEC ?=
SPEC_ARGS_eagle3 = --speculative-config models/minimax-m3-tiny-eagle3/speculative.json
SPEC_ARGS_ngram = --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'
serve: setup-build $(BUILD)/build.ninja
	@if [ -n "$(SPEC)" ] && [ -z "$(SPEC_ARGS_$(SPEC))" ]; then echo "make serve: SPEC must be eagle3 or ngram, not '$(SPEC)'" >&2; exit 2; fi
	cmake --build $(BUILD) -j $(JOBS) --target sieve
	$(BUILD)/sieve serve $(SPEC_ARGS_$(SPEC)) $(ARGS)

gpu-check:
	bash scripts/gpu-check out/gpu-check

format:
	clang-format -i $$(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.cpp' 'tests/*.h')

clean:
	rm -rf $(BUILD)
