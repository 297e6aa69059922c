# Thin wrapper over CMake. `make run` and `make test` are the README's two commands.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build run test check-asan fuzz bench clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/dflash generate --prompt "Once upon a time" -n 64

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

check-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDFLASH_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L unit

fuzz:
	@scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-asan build-fuzz
