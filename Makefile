# voxpipe — see README.md. `make run` and `make test` work on a fresh Debian bookworm machine.
GO      ?= go
BIN     := bin/voxpipe
LISTEN  ?= localhost:8080
# Debian packages the build needs (cgo: Opus via hraban/opus; OpenBLAS for the engine's GEMM;
# the Vulkan headers: the loader itself is opened at run time, so the binary runs without it).
BUILD_PKGS := libopus-dev libopusfile-dev libopenblas-dev libmp3lame-dev pkg-config gcc libvulkan-dev
# What the tests add: Mesa's lavapipe (Vulkan 1.3 on the CPU) runs every shader, glslc checks
# that the committed SPIR-V is current.
VULKAN_TEST_PKGS := mesa-vulkan-drivers glslc
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run build test test-go test-web bench bench-models fuzz deps test-deps vulkan-deps shaders shaders-check gpu-bundle clean

run: build ## build and start the server on http://localhost:8080 (LISTEN=host:port to change)
	./$(BIN) serve --listen $(LISTEN)

# The commit `voxpipe version` prints, for toolchains that do not stamp it.
COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null)

build: deps
	$(GO) build -ldflags "-X main.buildCommit=$(COMMIT) -X main.buildVersion=$(VERSION)" -o $(BIN) ./cmd/voxpipe

# Install missing Debian packages (only those missing, so a ready machine skips apt entirely).
# NAME:ARCH: with the arm64 -dev packages installed too (make cross-deps) a bare name is ambiguous.
deps:
	@missing=""; arch=$$(dpkg --print-architecture); for p in $(BUILD_PKGS); do dpkg -s $$p:$$arch >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

test-deps: deps
	@if [ ! -x /usr/bin/chromium ] || ! command -v node >/dev/null; then \
	  pkgs=chromium; command -v node >/dev/null || pkgs="$$pkgs nodejs npm"; \
	  echo "installing Debian packages: $$pkgs"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs; fi
	@[ -d node_modules/playwright-core ] && [ -d node_modules/openai ] || npm ci --no-audit --no-fund

vulkan-deps: deps
	@missing=""; for p in $(VULKAN_TEST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

# The compute shaders' SPIR-V (vulkan/spv, committed) from their GLSL (vulkan/shaders).
shaders: vulkan-deps
	$(GO) generate ./vulkan

# Fails when the committed SPIR-V is not what glslc makes of the shaders (make test runs it too).
shaders-check: vulkan-deps
	$(GO) test -count=1 -run TestSPIRVCurrent ./vulkan

test: test-go test-web ## all tests: Go (unit, parity, WebRTC loopback, Vulkan shaders on lavapipe) and the page in headless Chromium

test-go: deps vulkan-deps
	$(GO) vet ./...
	@# -p 1: packages one at a time, so the timing of the WebRTC tests is not measured under
	@# the load of another package's soak or model tests. -timeout 20m: on a fresh machine the
	@# LiveKit tests (worker/) first build livekit-server from its Go module (about 5 min).
	@# VOXPIPE_REQUIRE_VULKAN: the Vulkan tests fail rather than skip when lavapipe is missing.
	VOXPIPE_REQUIRE_VULKAN=1 $(GO) test -p 1 -count=1 -timeout 20m ./...

test-web: test-deps build
	node --test web/e2e/

# Random-weight models at the published sizes for the model benchmarks (made once, ≈ 6 GB).
BENCH_MODELS ?= .bench-models
bench-models: build
	@mkdir -p $(BENCH_MODELS)
	@[ -f $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf ] || ./$(BIN) mkmodel --family miotts --size 0.6b --dtype q8_0 --out $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf
	@[ -f $(BENCH_MODELS)/miotts-0.6b-f32.gguf ] || ./$(BIN) mkmodel --family miotts --size 0.6b --dtype f32 --out $(BENCH_MODELS)/miotts-0.6b-f32.gguf
	@# The codec in Q8_0, as `voxpipe pull miocodec` gets it (its published GGUF).
	@[ -f $(BENCH_MODELS)/miocodec-q8_0.gguf ] || ./$(BIN) mkmodel --family miocodec --dtype q8_0 --out $(BENCH_MODELS)/miocodec-q8_0.gguf
	@[ -f $(BENCH_MODELS)/meanvc2.gguf ] || ./$(BIN) mkmodel --family meanvc2 --out $(BENCH_MODELS)/meanvc2.gguf
	@[ -f $(BENCH_MODELS)/meanvc2-40ms.gguf ] || ./$(BIN) mkmodel --family meanvc2 --variant 40ms --out $(BENCH_MODELS)/meanvc2-40ms.gguf
	@# The MioTTS 0.6B originals (Hugging Face folder, 2.4 GB f32 safetensors in two shards) for the import benchmark.
	@[ -f $(BENCH_MODELS)/miotts-0.6b-orig/model.safetensors.index.json ] || ./$(BIN) mkmodel --family miotts --size 0.6b --originals $(BENCH_MODELS)/miotts-0.6b-orig

# For tools/gpu-figures.sh on a GPU machine that has neither Go nor Debian's libraries: the
# binary (stripped) with the shared libraries it links and the Vulkan loader, packed in
# .gpu/bundle.tar.gz (about 30 MB).
gpu-bundle: deps vulkan-deps ## pack the binary and its libraries into .gpu/ for tools/gpu-figures.sh
	@rm -rf .gpu && mkdir -p .gpu/stage/lib
	$(GO) build -trimpath -ldflags "-s -w -X main.buildCommit=$(COMMIT) -X main.buildVersion=$(VERSION)" -o .gpu/stage/voxpipe ./cmd/voxpipe
	@ldd .gpu/stage/voxpipe | awk '/=> \// {print $$3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt)\.so' | xargs -r -I{} cp -L {} .gpu/stage/lib/
	@cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 .gpu/stage/lib/
	@tar -C .gpu/stage -czf .gpu/bundle.tar.gz . && rm -rf .gpu/stage
	@ls -la .gpu/bundle.tar.gz

bench: build bench-models ## benchmarks: Go microbenchmarks, the engine, the models at real size, the WebRTC loopback
	@# The LM benchmarks (batched decode steps, a joining stream's prefill) on the real-size model.
	@# The MeanVC2 benchmark times each stage batched over 1…16 streams, MioCodec's its windows over 1…8.
	VOXPIPE_QWEN3_MODEL=$(BENCH_MODELS)/miotts-0.6b-q8_0.gguf VOXPIPE_MIOTTS_MODEL=$(BENCH_MODELS)/miotts-0.6b-q8_0.gguf \
	  VOXPIPE_MEANVC2_MODEL=$(BENCH_MODELS)/meanvc2.gguf VOXPIPE_MIOCODEC_MODEL=$(BENCH_MODELS)/miocodec-q8_0.gguf \
	  $(GO) test -run '^$$' -bench . -benchtime 1s ./...
	./$(BIN) bench miotts --model $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf --codec $(BENCH_MODELS)/miocodec-q8_0.gguf --threads 2 --streams 1,2,4,8 --json
	./$(BIN) bench miotts --model $(BENCH_MODELS)/miotts-0.6b-f32.gguf --codec $(BENCH_MODELS)/miocodec-q8_0.gguf --threads 2 --json
	@# voxpipe import of the MioTTS 0.6B originals: wall time, peak RSS (goal ≤ 1.5 × the largest input file), input MB/s.
	sh tools/ckptgen/import-bench.sh ./$(BIN) miotts $(BENCH_MODELS)/miotts-0.6b-orig f32
	sh tools/ckptgen/import-bench.sh ./$(BIN) miotts $(BENCH_MODELS)/miotts-0.6b-orig q8_0
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 2 --seconds 20 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 1 --seconds 20 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2-40ms.gguf --threads 2 --seconds 20 --json
	@# Concurrent sessions, batched (the default) and not (--batch 1), in one run each.
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 2 --seconds 10 --sessions 1,2,4,8,16 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 2 --seconds 10 --sessions 1,2,4,8,16 --batch 1 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --ref testdata/speech_en_48k.wav --seconds 20 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2-40ms.gguf --ref testdata/speech_en_48k.wav --seconds 20 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --ref testdata/speech_en_48k.wav --sessions 8 --seconds 20 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --ref testdata/speech_en_48k.wav --sessions 8 --seconds 20 --stagger 500ms --json
	@# LiveKit (worker/): rooms per worker with MeanVC2 (dsp rooms and the SFU latency ran with ./... above)
	VOXPIPE_BENCH_VC_MODEL=$(BENCH_MODELS)/meanvc2.gguf $(GO) test -run '^$$' -bench RoomsPerWorker -benchtime 1x ./worker/
	@# TTS WebSocket sessions on the real-size models: admission, TTFA and late chunks as load grows.
	for n in 1 2 4 8 16; do ./$(BIN) bench tts-load --model $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf --codec $(BENCH_MODELS)/miocodec-q8_0.gguf --sessions $$n --seconds 10 --json || exit 1; done
	./$(BIN) bench tts-load --sessions 1 --seconds 10 --json
	./$(BIN) bench tts-load --sessions 20 --seconds 10 --slots 2 --queue 50ms --json
	./$(BIN) bench gemm --json
	./$(BIN) bench planner --graph wavlm-large --seconds 10 --json
	./$(BIN) bench planner --graph wavlm-large --seconds 30 --json
	./$(BIN) bench dispatch --json
	./$(BIN) bench loopback --voice dsp --sessions 1 --seconds 10 --json
	./$(BIN) bench loopback --voice dsp --sessions 50 --seconds 10 --json
	./$(BIN) bench soak --minutes $${SOAK_MINUTES:-1} --json

fuzz: ## run each fuzz target for FUZZTIME (default 30s)
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $${FUZZTIME:-30s} ./engine/gguf
	$(GO) test -run '^$$' -fuzz FuzzRead -fuzztime $${FUZZTIME:-30s} ./dsp/wav
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $${FUZZTIME:-30s} -fuzzminimizetime 500x ./dsp/audiofile
	$(GO) test -run '^$$' -fuzz FuzzDecodeMessage -fuzztime $${FUZZTIME:-30s} ./rtc
	$(GO) test -run '^$$' -fuzz FuzzCheckOffer -fuzztime $${FUZZTIME:-30s} ./rtc
	$(GO) test -run '^$$' -fuzz FuzzEncode -fuzztime $${FUZZTIME:-30s} ./models/bpe
	$(GO) test -run '^$$' -fuzz FuzzDecodeClientMessage -fuzztime $${FUZZTIME:-30s} ./tts
	$(GO) test -run '^$$' -fuzz FuzzTwilioMessage -fuzztime $${FUZZTIME:-30s} ./telephony
	$(GO) test -run '^$$' -fuzz FuzzUpload -fuzztime $${FUZZTIME:-30s} ./voice/library
	$(GO) test -run '^$$' -fuzz FuzzPickle -fuzztime $${FUZZTIME:-30s} -fuzzminimizetime 500x ./engine/ckpt
	$(GO) test -run '^$$' -fuzz FuzzSafetensors -fuzztime $${FUZZTIME:-30s} ./engine/ckpt

clean:
	rm -rf bin $(BENCH_MODELS)

# ---- packaging (README: Install and deploy) ----
.PHONY: dist dist-archive build-arm64 cross-deps cross-check docker

# The release's name: the nearest tag, else the commit (-dirty with uncommitted changes).
VERSION = $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
DIST    ?= dist
# Archive timestamps: the commit's time, so the same commit gives the same archive.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
RELEASE_FLAGS = -trimpath -ldflags "-s -w -X main.buildCommit=$(COMMIT) -X main.buildVersion=$(VERSION)"
HOST_ARCH = $(shell $(GO) env GOARCH)
# linux/arm64 with cgo: Debian's cross compiler and the arm64 -dev packages (multiarch).
ARM64_CC   ?= aarch64-linux-gnu-gcc
ARM64_LIB  := /usr/lib/aarch64-linux-gnu
ARM64_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross libopus-dev:arm64 libopusfile-dev:arm64 libopenblas-dev:arm64 libmp3lame-dev:arm64
ARM64_ENV  := CC=$(ARM64_CC) CGO_ENABLED=1 GOOS=linux GOARCH=arm64 PKG_CONFIG_LIBDIR=$(ARM64_LIB)/pkgconfig:/usr/share/pkgconfig
ARM64_OK   := command -v $(ARM64_CC) >/dev/null && [ -f $(ARM64_LIB)/pkgconfig/opus.pc ] && [ -f $(ARM64_LIB)/pkgconfig/opusfile.pc ] && \
              [ -e $(ARM64_LIB)/libopenblas.so ] && [ -e $(ARM64_LIB)/libmp3lame.so ]

# Release archives dist/voxpipe-VERSION-linux-ARCH.tar.gz (binary, README, docs, systemd unit
# and env example) and dist/SHA256SUMS: this machine's architecture, and linux/arm64 when the
# cross toolchain is installed (make cross-deps), skipped with a message when it is not.
dist: deps
	@rm -rf $(DIST) bin/dist && mkdir -p $(DIST) bin/dist && echo '*' > $(DIST)/.gitignore
	$(GO) build $(RELEASE_FLAGS) -o bin/dist/linux-$(HOST_ARCH)/voxpipe ./cmd/voxpipe
	@$(MAKE) --no-print-directory dist-archive ARCH=$(HOST_ARCH)
	@if [ "$(HOST_ARCH)" = arm64 ]; then :; \
	elif $(ARM64_OK); then \
	  echo '$(ARM64_ENV) $(GO) build $(RELEASE_FLAGS) -o bin/dist/linux-arm64/voxpipe ./cmd/voxpipe'; \
	  $(ARM64_ENV) $(GO) build $(RELEASE_FLAGS) -o bin/dist/linux-arm64/voxpipe ./cmd/voxpipe && \
	  $(MAKE) --no-print-directory dist-archive ARCH=arm64; \
	else echo "dist: skipping linux/arm64: no cross toolchain ($(ARM64_CC) and the arm64 -dev packages; make cross-deps installs them)"; fi
	cd $(DIST) && sha256sum voxpipe-*.tar.gz > SHA256SUMS && cat SHA256SUMS

# One archive from bin/dist/linux-$(ARCH)/voxpipe (called by dist).
dist-archive:
	@d=voxpipe-$(VERSION)-linux-$(ARCH); s=bin/dist/stage/$$d; rm -rf $$s && \
	mkdir -p $$s/docs $$s/packaging && \
	install -m 0755 bin/dist/linux-$(ARCH)/voxpipe $$s/voxpipe && \
	install -m 0644 README.md $(wildcard LICENSE*) $$s/ && \
	install -m 0644 docs/*.md $$s/docs/ && \
	install -m 0644 packaging/voxpipe.service packaging/voxpipe.env.example $$s/packaging/ && \
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@$(SOURCE_DATE_EPOCH) \
	  -C bin/dist/stage -cf - $$d | gzip -9n > $(DIST)/$$d.tar.gz && \
	echo "$(DIST)/$$d.tar.gz: $$(du -h $(DIST)/$$d.tar.gz | cut -f1)"

# bin/linux-arm64/voxpipe (needs the cross toolchain: make cross-deps).
build-arm64: deps
	@$(ARM64_OK) || { echo "build-arm64: no cross toolchain: make cross-deps (Debian: $(ARM64_PKGS))"; exit 1; }
	$(ARM64_ENV) $(GO) build -ldflags "-X main.buildCommit=$(COMMIT)" -o bin/linux-arm64/voxpipe ./cmd/voxpipe

# Installs the linux/arm64 cross toolchain (Debian multiarch), only when missing.
cross-deps:
	@$(ARM64_OK) || { echo "installing Debian packages: $(ARM64_PKGS)"; \
	  $(SUDO) dpkg --add-architecture arm64 && $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(ARM64_PKGS) >/dev/null; }

# CI's portability check (build only): the whole binary for linux/arm64 (cgo, the portable C
# kernels), and go vet for macOS of the packages that need no cgo (packaging/pure-go-packages.sh).
cross-check: cross-deps build-arm64
	@pure=$$(GO=$(GO) sh packaging/pure-go-packages.sh); \
	echo "GOOS=darwin|windows CGO_ENABLED=0 go vet ($$(echo $$pure | wc -w) pure-Go packages)"; \
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) vet $$pure && GOOS=windows GOARCH=amd64 CGO_ENABLED=0 $(GO) vet $$pure

# The container image (Dockerfile); needs a Docker engine.
docker:
	docker build --build-arg VOXPIPE_COMMIT=$(COMMIT) -t voxpipe:$(VERSION) -t voxpipe:latest .
