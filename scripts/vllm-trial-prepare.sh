#!/usr/bin/env bash
# Prepares the kit that scripts/vllm-trial.sh runs vLLM from on a GPU node
# that cannot reach a package index: .vllm-trial/ (ignored by git) gets
#   download/    vLLM 0.26.0's wheel as PyPI has it (303.7 MB; kept so that a
#                second run needs no download). 0.26.0 is the release that
#                pins torch 2.11.0, the GPU node's torch
#   parts/       what must travel, as one tar cut into parts of at most
#                --part-size MiB, and SHA256SUMS for each part and the whole:
#                the slim vLLM wheel (the full one less the FlashAttention 2
#                library, the MoE kernels, the vllm-rs binary and the
#                DeepGEMM and SM100 FMHA sources, none of which the trial's
#                dense model uses on an H200, where vLLM picks
#                FlashAttention 3)
#                and the 21 small wheels vLLM's offline engine needs that a
#                PyTorch image lacks
# About 125 MB travel. The LMCache kit comes from scripts/gpu-trial-prepare.sh
# (.gpu-trial/, about 40 MB); vllm-trial.sh installs LMCache from it, or
# reuses the install that scripts/gpu-trial.sh left on the node. Copy the
# checkout with both kits to the GPU node, or send the parts over several
# copies: vllm-trial.sh --stash keeps each part it finds in /tmp on the node
# until all are there (docs/performance.md, "vLLM on the GPU node").
#
# --python-version X.Y  the GPU node's python3 (default 3.12): the small
#                       wheels are built for one Python
# --part-size MIB       the largest part (default 20): pick it so that each
#                       copy to the node stays within what one copy can take
#
# Usage: scripts/vllm-trial-prepare.sh [--python-version X.Y] [--part-size MIB]
set -euo pipefail

usage() { sed -n '/^# Prepares/,/^# Usage/s/^# \{0,1\}//p' "$0"; }
value() {
  [ -n "${2:-}" ] || { echo "vllm-trial-prepare: $1 needs a value (see --help)" >&2; exit 2; }
  echo "$2"
}

PYTHON_VERSION=3.12
PART_MIB=20
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYTHON_VERSION=$(value "$@"); shift 2 ;;
    --part-size) PART_MIB=$(value "$@"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "vllm-trial-prepare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$PART_MIB" in
  '' | *[!0-9]* | 0) echo "vllm-trial-prepare: --part-size takes a whole number of MiB, not $PART_MIB" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIT=$ROOT/.vllm-trial
VLLM_VERSION=0.26.0
TORCH_PIN=torch==2.11.0
WHEEL=vllm-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
# What the slim wheel leaves out, as zip patterns; each must match.
DROP=('vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/_moe_C*.so' 'vllm/vllm-rs'
  'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*')
# What `LLM(...)` imports beyond a PyTorch image, at the versions vLLM
# 0.26.0's requirements resolve to.
SMALL=(cbor2==6.3.0 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 jiter==0.19.0
  sniffio==1.3.1 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
  pybase64==1.5.1 setproctitle==1.3.8 depyf==0.20.0 astor==0.8.1 dill==0.4.1
  compressed-tensors==0.17.0 loguru==0.7.3 aiofile==3.12.3 caio==0.12.10
  llguidance==1.7.6 xgrammar==0.2.7 outlines-core==0.2.14 apache-tvm-ffi==0.1.10)
PLATFORMS=()
for n in 35 34 31 28 27 24 17; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

say() { echo "vllm-trial-prepare: $*" >&2; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
size() { stat -c %s "$1"; }

mkdir -p "$KIT/download"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ -f "$KIT/download/$WHEEL" ] && unzip -tq "$KIT/download/$WHEEL" > /dev/null 2>&1; then
  say "vLLM $VLLM_VERSION's wheel is already in $KIT/download"
else
  say "downloading vLLM $VLLM_VERSION's wheel (303.7 MB)"
  rm -f "$KIT/download/$WHEEL"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d "$KIT/download" "vllm==$VLLM_VERSION"
fi
[ -f "$KIT/download/$WHEEL" ] || { say "pip left no $WHEEL in $KIT/download"; exit 1; }
unzip -p "$KIT/download/$WHEEL" "vllm-$VLLM_VERSION.dist-info/METADATA" |
  grep -qx "Requires-Dist: $TORCH_PIN" ||
  { say "vLLM $VLLM_VERSION does not pin $TORCH_PIN: it is not the release for the node's torch"; exit 1; }

say "making the slim wheel"
mkdir -p "$WORK/kit/wheels"
cp "$KIT/download/$WHEEL" "$WORK/kit/$WHEEL"
unzip -Z1 "$WORK/kit/$WHEEL" > "$WORK/members"
for pattern in "${DROP[@]}"; do
  # zip's own patterns: * matches across /, as the entries listed by unzip.
  matched=$(awk -v p="$pattern" 'BEGIN {gsub(/\./, "\\.", p); gsub(/\*/, ".*", p); p = "^" p "$"} $0 ~ p' "$WORK/members" | wc -l)
  [ "$matched" -gt 0 ] || { say "$pattern is not in $WHEEL: check what the wheel holds (unzip -l)"; exit 1; }
  zip -q -d "$WORK/kit/$WHEEL" "$pattern"
  say "  left out $pattern ($matched entries)"
done
say "  slim wheel $(mib "$(size "$WORK/kit/$WHEEL")") (full $(mib "$(size "$KIT/download/$WHEEL")"))"
for module in vllm/_C_stable_libtorch.abi3.so vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so; do
  unzip -Z1 "$WORK/kit/$WHEEL" "$module" > /dev/null 2>&1 || { say "the slim wheel lost $module"; exit 1; }
done

say "downloading ${#SMALL[@]} small wheels for CPython $PYTHON_VERSION"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation cp "${PLATFORMS[@]}" -d "$WORK/kit/wheels" "${SMALL[@]}"
count=$(find "$WORK/kit/wheels" -name '*.whl' | wc -l)
[ "$count" = "${#SMALL[@]}" ] || { say "got $count wheels for ${#SMALL[@]} packages"; exit 1; }

say "cutting the kit into parts of at most $PART_MIB MiB"
rm -rf "$KIT/parts"
mkdir -p "$KIT/parts"
tar -cf "$WORK/vllm-kit.tar" -C "$WORK/kit" .
split -b "${PART_MIB}M" -d -a 2 "$WORK/vllm-kit.tar" "$KIT/parts/vllm-kit.tar.part-"
(cd "$KIT/parts" && sha256sum vllm-kit.tar.part-* > SHA256SUMS)
(cd "$WORK" && sha256sum vllm-kit.tar) >> "$KIT/parts/SHA256SUMS"
for part in "$KIT"/parts/vllm-kit.tar.part-*; do
  say "  ${part#"$ROOT"/} $(mib "$(size "$part")")"
done
say "kit ready: $(mib "$(size "$WORK/vllm-kit.tar")") in $(find "$KIT/parts" -name 'vllm-kit.tar.part-*' | wc -l) parts, in $KIT/parts"
say "each copy to the node takes SHA256SUMS and any parts; vllm-trial.sh --stash keeps them until all are there"
