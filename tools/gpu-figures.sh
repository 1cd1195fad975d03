#!/bin/sh
# The GPU figures of the Vulkan backend against the CPU backend, in one run on a machine with
# a GPU: MeanVC2's conversion RTF and chunk p90, MioTTS-0.6B's decode tokens/s (Q8_0 and F16;
# Q8_0 also without integer dot products, VOXPIPE_VULKAN_INT8_DOT=0, and without Linear's
# tiles, VOXPIPE_VULKAN_TILE_ROWS=0; F16 also without binary16 tiles, VOXPIPE_VULKAN_F16=0),
# prefill, TTFA and codec RTF, and the device memory each uses.
# Each bench writes its JSON into OUT, with the devices and a log; the CPU runs use 2
# threads, as the CPU figures elsewhere do.
#
#   make gpu-bundle                       # here: the binary and its libraries, packed in .gpu/
#   tools/gpu-figures.sh OUT [STAGE...]   # there; STAGE: meanvc2, miotts-q8_0, miotts-f16
#                                         # (default: all three; one stage per call fits better)
#
# It runs $BIN when set, else .gpu/bundle.tar.gz's binary when there is one (a machine
# without Debian's libraries), else bin/voxpipe. Models are made at real size with random
# weights into $MODELS (default .bench-models) when missing; DIMS=tiny makes the golden
# test models' dimensions instead (the codec is $VOXPIPE_GOLDEN_DIR's), to try the script
# on any machine in a few minutes.
set -u
OUT=${1:-gpu-figures}
[ $# -gt 0 ] && shift
STAGES=${*:-meanvc2 miotts-q8_0 miotts-f16}
MODELS=${MODELS:-.bench-models}
DIMS=${DIMS:-real}
mkdir -p "$OUT" "$MODELS"
LOG=$OUT/log.txt

log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

if [ -z "${BIN:-}" ] && [ -f .gpu/bundle.tar.gz ]; then
	rm -rf .gpu/run && mkdir -p .gpu/run && tar -C .gpu/run -xzf .gpu/bundle.tar.gz || exit 1
	BIN=$PWD/.gpu/run/voxpipe
	export LD_LIBRARY_PATH=$PWD/.gpu/run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
BIN=${BIN:-bin/voxpipe}
# NVIDIA's Vulkan driver, where the loader does not find it by itself.
if [ -z "${VK_DRIVER_FILES:-}" ]; then
	for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
		if [ -f "$f" ]; then
			export VK_DRIVER_FILES=$f
			break
		fi
	done
fi

log "devices (VK_DRIVER_FILES=${VK_DRIVER_FILES:-})"
"$BIN" devices --gpu >"$OUT/devices.txt" 2>&1
tee -a "$LOG" <"$OUT/devices.txt"
if ! grep -q '^  0: ' "$OUT/devices.txt"; then
	log "no Vulkan device: nothing to measure"
	exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"

# model FILE FLAGS...: makes FILE in $MODELS unless it is there (a tiny MioCodec is the
# golden folder's: mkmodel makes none).
model() {
	f=$MODELS/$1
	shift
	[ -f "$f" ] && return 0
	case "$DIMS $*" in
	"tiny --family miocodec"*)
		cp "${VOXPIPE_GOLDEN_DIR:-../shared/golden}/miocodec/model.gguf" "$f" || { log "no golden MioCodec"; return 1; }
		return 0
		;;
	esac
	log "making $f"
	"$BIN" mkmodel --dims "$DIMS" "$@" --out "$f" >>"$LOG" 2>&1 || { log "mkmodel failed"; return 1; }
}

# bench NAME ARGS...: one bench on Vulkan and on the CPU, JSON to OUT/NAME-{vulkan,cpu}.json;
# AB lists Vulkan variants run too, each into NAME-vulkan-VARIANT.json: noint8 (no integer
# dot products), nof16 (no binary16 tiles), notiles (Linear never in tiles).
bench() {
	name=$1
	shift
	for run in vulkan $(for v in ${AB:-}; do echo "vulkan-$v"; done) cpu; do
		dot=${VOXPIPE_VULKAN_INT8_DOT:-}
		f16=${VOXPIPE_VULKAN_F16:-}
		rows=${VOXPIPE_VULKAN_TILE_ROWS:-}
		case $run in
		*-noint8) dot=0 ;;
		*-nof16) f16=0 ;;
		*-notiles) rows=0 ;;
		esac
		log "bench $name on $run"
		start=$(date +%s)
		if VOXPIPE_VULKAN_INT8_DOT=$dot VOXPIPE_VULKAN_F16=$f16 VOXPIPE_VULKAN_TILE_ROWS=$rows \
			"$BIN" bench "$@" --backend "${run%%-*}" --threads 2 --json >"$OUT/$name-$run.json" 2>>"$LOG"; then
			log "bench $name on $run: $(($(date +%s) - start)) s"
		else
			log "bench $name on $run failed (exit $?)"
		fi
	done
}

for stage in $STAGES; do
	case $stage in
	meanvc2)
		model meanvc2-$DIMS.gguf --family meanvc2 &&
			bench meanvc2 meanvc2 --model "$MODELS/meanvc2-$DIMS.gguf" --seconds 20
		;;
	miotts-q8_0 | miotts-f16)
		dt=${stage#miotts-}
		model miotts-0.6b-$dt-$DIMS.gguf --family miotts --size 0.6b --dtype "$dt" &&
			model miocodec-$dt-$DIMS.gguf --family miocodec --dtype "$dt" &&
			AB=$([ "$dt" = q8_0 ] && echo noint8 notiles || echo nof16) bench "$stage" miotts --model "$MODELS/miotts-0.6b-$dt-$DIMS.gguf" --codec "$MODELS/miocodec-$dt-$DIMS.gguf"
		;;
	*)
		log "unknown stage $stage (meanvc2, miotts-q8_0, miotts-f16)"
		exit 2
		;;
	esac
done
log done
