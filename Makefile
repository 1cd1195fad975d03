# voxpipe — see README.md. `make run` and `make test` work on a fresh Debian bookworm machine.
GO      ?= go
BIN     := bin/voxpipe
LISTEN  ?= localhost:8080
# Debian packages the build needs (cgo: Opus via hraban/opus; OpenBLAS for the engine's GEMM).
BUILD_PKGS := libopus-dev libopusfile-dev libopenblas-dev libmp3lame-dev pkg-config gcc
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run build test test-go test-web bench bench-models fuzz deps test-deps clean

run: build ## build and start the server on http://localhost:8080 (LISTEN=host:port to change)
	./$(BIN) serve --listen $(LISTEN)

# The commit `voxpipe version` prints, for toolchains that do not stamp it.
COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null)

build: deps
	$(GO) build -ldflags "-X main.buildCommit=$(COMMIT)" -o $(BIN) ./cmd/voxpipe

# Install missing Debian packages (only those missing, so a ready machine skips apt entirely).
deps:
	@missing=""; for p in $(BUILD_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

test-deps: deps
	@if [ ! -x /usr/bin/chromium ] || ! command -v node >/dev/null; then \
	  pkgs=chromium; command -v node >/dev/null || pkgs="$$pkgs nodejs npm"; \
	  echo "installing Debian packages: $$pkgs"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs; fi
	@[ -d node_modules/playwright-core ] && [ -d node_modules/openai ] || npm ci --no-audit --no-fund

test: test-go test-web ## all tests: Go (unit, parity, WebRTC loopback) and the page in headless Chromium

test-go: deps
	$(GO) vet ./...
	@# -p 1: packages one at a time, so the timing of the WebRTC tests is not measured under
	@# the load of another package's soak or model tests.
	$(GO) test -p 1 -count=1 ./...

test-web: test-deps build
	node --test web/e2e/

# Random-weight models at the published sizes for the model benchmarks (made once, ≈ 6 GB).
BENCH_MODELS ?= .bench-models
bench-models: build
	@mkdir -p $(BENCH_MODELS)
	@[ -f $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf ] || ./$(BIN) mkmodel --family miotts --size 0.6b --dtype q8_0 --out $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf
	@[ -f $(BENCH_MODELS)/miotts-0.6b-f32.gguf ] || ./$(BIN) mkmodel --family miotts --size 0.6b --dtype f32 --out $(BENCH_MODELS)/miotts-0.6b-f32.gguf
	@[ -f $(BENCH_MODELS)/miocodec.gguf ] || ./$(BIN) mkmodel --family miocodec --out $(BENCH_MODELS)/miocodec.gguf
	@[ -f $(BENCH_MODELS)/meanvc2.gguf ] || ./$(BIN) mkmodel --family meanvc2 --out $(BENCH_MODELS)/meanvc2.gguf
	@[ -f $(BENCH_MODELS)/meanvc2-40ms.gguf ] || ./$(BIN) mkmodel --family meanvc2 --variant 40ms --out $(BENCH_MODELS)/meanvc2-40ms.gguf

bench: build bench-models ## benchmarks: Go microbenchmarks, the engine, the models at real size, the WebRTC loopback
	$(GO) test -run '^$$' -bench . -benchtime 1s ./...
	./$(BIN) bench miotts --model $(BENCH_MODELS)/miotts-0.6b-q8_0.gguf --codec $(BENCH_MODELS)/miocodec.gguf --threads 2 --json
	./$(BIN) bench miotts --model $(BENCH_MODELS)/miotts-0.6b-f32.gguf --codec $(BENCH_MODELS)/miocodec.gguf --threads 2 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 2 --seconds 20 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --threads 1 --seconds 20 --json
	./$(BIN) bench meanvc2 --model $(BENCH_MODELS)/meanvc2-40ms.gguf --threads 2 --seconds 20 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2.gguf --ref testdata/speech_en_48k.wav --seconds 20 --json
	./$(BIN) bench loopback --voice meanvc2 --model $(BENCH_MODELS)/meanvc2-40ms.gguf --ref testdata/speech_en_48k.wav --seconds 20 --json
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
	$(GO) test -run '^$$' -fuzz FuzzUpload -fuzztime $${FUZZTIME:-30s} ./voice/library
	$(GO) test -run '^$$' -fuzz FuzzPickle -fuzztime $${FUZZTIME:-30s} -fuzzminimizetime 500x ./engine/ckpt
	$(GO) test -run '^$$' -fuzz FuzzSafetensors -fuzztime $${FUZZTIME:-30s} ./engine/ckpt

clean:
	rm -rf bin $(BENCH_MODELS)
