#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (TensorFlow + Gloo, CPU only; no MPI, PyTorch, MXNet or CUDA)
# into the Python environment of the given interpreter. Non-interactive and idempotent.
#
#   bash tools/install_horovod.sh /path/to/venv/bin/python
#
# Why a script: the published sdist does not build against TensorFlow 2.21 as is.
#   - horovod/tensorflow/xla_mpi_ops.cc includes XLA headers that TF 2.21's wheel no longer
#     ships; that source is dropped from horovod/tensorflow/CMakeLists.txt (it only provides the
#     XLA-compiled ops, opt-in via HOROVOD_ENABLE_XLA_OPS=1; jit_compile'd Horovod ops won't work).
#   - CUDA detection is switched off so that a local nvcc never turns this into a GPU build.
#   - cmake >= 4 rejects Gloo's old cmake_minimum_required: CMAKE_POLICY_VERSION_MINIMUM=3.5.
#   - Gloo controller bug: global_ranks_ is reserve()d, never resize()d, so the stall inspector
#     sees 0 ranks and never warns about (nor, with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, shuts
#     down on) a rank that stops submitting collectives: a hung rank hangs the job forever.
# The build records itself in horovod/_sok_build.py (patch level + TensorFlow version); the
# "already installed" check requires it, so an unpatched horovod or a TF upgrade triggers a rebuild.
# The built wheel is cached in ${SOK_CACHE_DIR:-$HOME/.cache/sok}/wheels/, keyed by the patch
# level, TensorFlow version and Python tag, so a second run only installs it.
#
# Environment knobs: SOK_CACHE_DIR (cache root), HOROVOD_BUILD_JOBS (default: nproc),
# SOK_HOROVOD_REBUILD=1 (ignore the cached wheel and the installed copy).
set -euo pipefail

HVD_VERSION=0.28.1
HVD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
SOK_PATCH_LEVEL=1   # bump whenever the patches below change (invalidates cached wheels)

log() { echo "[install_horovod] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || die "usage: bash $0 /path/to/venv/bin/python"
PY=$1
[[ -x "$PY" ]] || die "not an executable: $PY"
# Keep the venv's path as given (do not resolve symlinks: that would escape the venv).
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac

# The check that decides whether there is anything to do. Run in a clean Horovod environment so
# that launcher variables from a caller (e.g. inside horovodrun) do not make init() wait for peers.
hvd_ok() {
    env -u HOROVOD_RANK -u HOROVOD_SIZE -u HOROVOD_CONTROLLER -u HOROVOD_CPU_OPERATIONS \
        -u HOROVOD_GLOO_RENDEZVOUS_ADDR -u HOROVOD_GLOO_RENDEZVOUS_PORT \
        TF_CPP_MIN_LOG_LEVEL=3 "$PY" - "$HVD_VERSION" "$SOK_PATCH_LEVEL" <<'EOF' >/dev/null 2>&1
import sys
import horovod
assert horovod.__version__ == sys.argv[1], horovod.__version__
from horovod import _sok_build
assert _sok_build.PATCH_LEVEL == int(sys.argv[2])
import tensorflow as tf
assert _sok_build.TF_VERSION == tf.__version__
import horovod.tensorflow as hvd
assert hvd.gloo_built()
hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0
assert int(hvd.allreduce(tf.constant([2.0]), op=hvd.Sum).numpy()[0]) == 2
EOF
}

if [[ "${SOK_HOROVOD_REBUILD:-0}" != 1 ]] && hvd_ok; then
    log "horovod $HVD_VERSION (TensorFlow, Gloo) already works with $PY: nothing to do"
    exit 0
fi

PIP=("$PY" -m pip --disable-pip-version-check --no-input)
"${PIP[@]}" --version >/dev/null 2>&1 || die "pip is not available for $PY"

TF_VERSION=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
    || die "TensorFlow is not importable with $PY; install it first"
PY_TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
log "python $PY ($PY_TAG), tensorflow $TF_VERSION"

CACHE_ROOT=${SOK_CACHE_DIR:-$HOME/.cache/sok}
WHEEL_DIR="$CACHE_ROOT/wheels/horovod-$HVD_VERSION-sok$SOK_PATCH_LEVEL-tf$TF_VERSION-$PY_TAG"
SDIST_DIR="$CACHE_ROOT/sdist"
mkdir -p "$WHEEL_DIR" "$SDIST_DIR"

install_wheel() {
    local whl=$1
    log "installing $whl"
    # Replace whatever horovod is there (a broken 0.28.1 would otherwise count as satisfied),
    # then let pip add the small runtime dependencies (cloudpickle, psutil, pyyaml, packaging).
    "${PIP[@]}" install -q --no-deps --force-reinstall "$whl"
    "${PIP[@]}" install -q "$whl"
    hvd_ok || die "horovod installed from $whl but the import/init check fails; run:
  $PY -c 'import horovod.tensorflow as hvd; hvd.init()'"
    log "done: horovod $HVD_VERSION works with $PY"
}

cached_wheel() {
    compgen -G "$WHEEL_DIR/horovod-$HVD_VERSION-*.whl" | head -n 1 || true
}

WHL=$(cached_wheel)
if [[ -n "$WHL" && "${SOK_HOROVOD_REBUILD:-0}" != 1 ]]; then
    install_wheel "$WHL"
    exit 0
fi

# ---------------------------------------------------------------- system packages (build only)
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo -n); fi
fi
cmake_ok() {
    command -v cmake >/dev/null 2>&1 || return 1
    local v
    v=$(cmake --version | sed -n '1s/.*version \([0-9]*\.[0-9]*\).*/\1/p')
    [[ -n "$v" ]] && printf '%s\n3.13\n' "$v" | sort -V -C -r
}
need_pkgs=()
command -v g++ >/dev/null 2>&1 || need_pkgs+=(g++)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
cmake_ok || need_pkgs+=(cmake)
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${need_pkgs[*]} and no apt-get to install them"
    log "apt-get install ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
cmake_ok || die "cmake >= 3.13 is still not available"

# ---------------------------------------------------------------- python build requirements
# --no-build-isolation: setup.py needs TensorFlow (already here) plus these in the same env.
if ! "$PY" -c 'import setuptools, wheel, packaging' >/dev/null 2>&1; then
    log "pip install setuptools wheel packaging"
    "${PIP[@]}" install -q setuptools wheel packaging
fi

# ---------------------------------------------------------------- source
SDIST="$SDIST_DIR/horovod-$HVD_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]] || ! echo "$HVD_SDIST_SHA256  $SDIST" | sha256sum -c --status; then
    log "downloading horovod $HVD_VERSION sdist"
    rm -f "$SDIST"
    tmpdl=$(mktemp -d)
    # --no-build-isolation: do not build the metadata in an isolated env (needs nothing new).
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
        -d "$tmpdl" "horovod==$HVD_VERSION"
    mv "$tmpdl/horovod-$HVD_VERSION.tar.gz" "$SDIST"
    rm -rf "$tmpdl"
fi
echo "$HVD_SDIST_SHA256  $SDIST" | sha256sum -c --status || die "sha256 mismatch for $SDIST"

BUILD_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
trap 'rm -rf "$BUILD_ROOT"' EXIT
tar -xzf "$SDIST" -C "$BUILD_ROOT"
SRC="$BUILD_ROOT/horovod-$HVD_VERSION"

# ---------------------------------------------------------------- patches (each must apply)
"$PY" - "$SRC" "$SOK_PATCH_LEVEL" "$TF_VERSION" <<'EOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])

def patch(rel, old, new):
    p = src / rel
    text = p.read_text()
    n = text.count(old)
    if n != 1:
        sys.exit(f"patch for {rel} does not apply ({n} matches of {old!r})")
    p.write_text(text.replace(old, new))
    print(f"[install_horovod] patched {rel}", file=sys.stderr)

# 1. XLA custom-call ops: their headers are not in TF 2.21's wheel.
patch("horovod/tensorflow/CMakeLists.txt",
      'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n',
      '# (sok) xla_mpi_ops.cc dropped: TF 2.21 wheel lacks its XLA headers\n')

# 2. CPU-only: never pick up a local nvcc / CUDA toolkit.
patch("CMakeLists.txt",
      "include(CheckLanguage)\ncheck_language(CUDA)\nif(NOT CMAKE_CUDA_COMPILER)\n",
      "include(CheckLanguage)\n# (sok) CPU-only build: CUDA detection disabled\n"
      "set(CMAKE_CUDA_COMPILER \"\")\nif(FALSE)\n")

# 3. Gloo controller: size global_ranks_ before allgathering into it (else size() == 0 and the
#    stall inspector can never report or shut down on a stalled rank).
patch("horovod/common/gloo/gloo_controller.cc",
      "  global_ranks_.reserve(size_);\n",
      "  global_ranks_.resize(size_);  // (sok) was reserve(): size() stayed 0\n")

# Build marker checked by the "already installed" test of tools/install_horovod.sh.
(src / "horovod" / "_sok_build.py").write_text(
    f"# Written by sparse_operation_kit tools/install_horovod.sh\n"
    f"PATCH_LEVEL = {int(sys.argv[2])}\nTF_VERSION = {sys.argv[3]!r}\n")
EOF

# ---------------------------------------------------------------- build
for v in $(env | sed -n 's/^\(HOROVOD_[A-Z_]*\)=.*/\1/p'); do
    case "$v" in HOROVOD_BUILD_JOBS) ;; *) unset "$v" ;; esac
done
JOBS=${HOROVOD_BUILD_JOBS:-$(nproc)}
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO \
       HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_CMAKE=$(command -v cmake)
export CMAKE_POLICY_VERSION_MINIMUM=3.5
export MAKEFLAGS="-j$JOBS"

log "building horovod $HVD_VERSION wheel with $JOBS jobs (takes minutes; log: $BUILD_ROOT/build.log)"
start=$(date +%s)
if ! "${PIP[@]}" wheel -v --no-deps --no-build-isolation -w "$BUILD_ROOT/dist" "$SRC" \
        >"$BUILD_ROOT/build.log" 2>&1; then
    cp "$BUILD_ROOT/build.log" "$CACHE_ROOT/horovod-build-failed.log"
    grep -E -m 20 'error|Error' "$BUILD_ROOT/build.log" >&2 || true
    die "build failed; full log in $CACHE_ROOT/horovod-build-failed.log"
fi
log "built in $(( $(date +%s) - start )) s"

WHL=$(compgen -G "$BUILD_ROOT/dist/horovod-$HVD_VERSION-*.whl" | head -n 1) || die "no wheel produced"
rm -f "$WHEEL_DIR"/horovod-*.whl
cp "$WHL" "$WHEEL_DIR/"
install_wheel "$WHEEL_DIR/$(basename "$WHL")"
