#!/usr/bin/env bash
# Build and install Horovod 0.28.1 for TensorFlow (no MPI, PyTorch or MXNet) into the Python
# environment of the given interpreter. Non-interactive and idempotent.
#
#   bash tools/install_horovod.sh /path/to/venv/bin/python
#   bash tools/install_horovod.sh --cuda-home   # prints the CUDA toolkit it would use (empty: none)
#
# Two flavours, chosen by whether a CUDA toolkit (nvcc) is found (find_cuda_home below):
#   - no nvcc: CPU only, Gloo for every collective;
#   - nvcc:    Gloo for CPU tensors plus NCCL for GPU tensors (HOROVOD_GPU_OPERATIONS=NCCL), CUDA
#     kernels for sm_90 (Hopper), the CUDA runtime linked statically. NCCL's header and
#     libnccl.so.2 come from PyPI's nvidia-nccl-cu<CUDA major> wheel, installed into the same
#     environment. NCCL is linked as a shared library, found at run time through a RUNPATH of
#     $ORIGIN/../../nvidia/nccl/lib (that wheel, where installed beside horovod), else the
#     system's libnccl.so.2 (a GPU machine's own NCCL); LD_LIBRARY_PATH comes first. This flavour
#     needs TensorFlow's GPU build (PyPI's `tensorflow`, which also runs without a GPU): it does
#     not load into `tensorflow-cpu` (undefined DenseUpdate<Eigen::GpuDevice, bool, ASSIGN>).
#     Without a GPU or a driver it loads and runs CPU tensors through Gloo.
#
# Why a script: the published sdist does not build against TensorFlow 2.21 as is.
#   - horovod/tensorflow/xla_mpi_ops.cc includes XLA headers that TF 2.21's wheel no longer
#     ships; that source is dropped from horovod/tensorflow/CMakeLists.txt (it only provides the
#     XLA-compiled ops, opt-in via HOROVOD_ENABLE_XLA_OPS=1; jit_compile'd Horovod ops won't work).
#   - CPU flavour: CUDA detection is switched off so that a stray nvcc never turns it into a GPU
#     build.
#   - cmake >= 4 rejects Gloo's old cmake_minimum_required: CMAKE_POLICY_VERSION_MINIMUM=3.5.
#   - Gloo controller bug: global_ranks_ is reserve()d, never resize()d, so the stall inspector
#     sees 0 ranks and never warns about (nor, with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, shuts
#     down on) a rank that stops submitting collectives: a hung rank hangs the job forever.
#   - horovod/tensorflow/mpi_ops.cc (GPU code) declares stream_executor::gpu::AsGpuStreamValue,
#     which TF 2.21 does not export: the CUDA stream is taken from the TF Stream's
#     platform_specific_handle() instead.
#   - NCCL flavour: FindNCCL looks for libnccl.so, which the nvidia-nccl wheel lacks (it has
#     libnccl.so.2); the TensorFlow library gets the RUNPATH above and no build-tree paths.
# The build records itself in horovod/_sok_build.py (patch level, TensorFlow version, NCCL or
# not); the "already installed" check requires it, and an NCCL build where nvcc is found, so an
# unpatched horovod, a TF upgrade or a Gloo-only build on a CUDA machine triggers a rebuild.
# The built wheel is cached in ${SOK_CACHE_DIR:-$HOME/.cache/sok}/wheels/, keyed by the patch
# level, flavour (gloo or nccl-cuNN), TensorFlow version and Python tag, so a second run only
# installs it.
#
# Environment knobs: SOK_CACHE_DIR (cache root), HOROVOD_BUILD_JOBS (default: nproc),
# SOK_HOROVOD_REBUILD=1 (ignore the cached wheel and the installed copy), SOK_HOROVOD_GPU=0 (CPU
# flavour even where nvcc is found) or 1 (fail unless nvcc is found), HOROVOD_CUDA_HOME or
# CUDA_HOME (the CUDA toolkit; default /usr/local/cuda, else the one of the nvcc on PATH),
# HOROVOD_BUILD_CUDA_CC_LIST (compute capabilities of Horovod's CUDA kernels, default 90; not part
# of the cache key: add SOK_HOROVOD_REBUILD=1 when changing it).
set -euo pipefail

HVD_VERSION=0.28.1
HVD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
SOK_PATCH_LEVEL=2   # bump whenever the patches below change (invalidates cached wheels)

log() { echo "[install_horovod] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The CUDA toolkit of the NCCL flavour, or nothing (CPU flavour). tools/setup.sh asks the same
# (--cuda-home) to choose between tensorflow and tensorflow-cpu.
find_cuda_home() {
    case "${SOK_HOROVOD_GPU:-}" in
        0) return 0 ;;
        1|"") ;;
        *) die "SOK_HOROVOD_GPU must be 0, 1 or unset" ;;
    esac
    local d nvcc
    for d in "${HOROVOD_CUDA_HOME:-}" "${CUDA_HOME:-}" /usr/local/cuda; do
        if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then echo "$d"; return 0; fi
    done
    # An nvcc on PATH (maybe a wrapper script): ask it where its toolkit is.
    if nvcc=$(command -v nvcc 2>/dev/null); then
        d=$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
        if [[ -n "$d" && -x "$d/bin/nvcc" ]]; then (cd "$d" && pwd -P); return 0; fi
    fi
    [[ "${SOK_HOROVOD_GPU:-}" != 1 ]] || die "SOK_HOROVOD_GPU=1 but no CUDA toolkit (nvcc) was found"
}

if [[ "${1:-}" == --cuda-home ]]; then
    find_cuda_home
    exit 0
fi

[[ $# -eq 1 ]] || die "usage: bash $0 /path/to/venv/bin/python   (or: bash $0 --cuda-home)"
PY=$1
[[ -x "$PY" ]] || die "not an executable: $PY"
# Keep the venv's path as given (do not resolve symlinks: that would escape the venv).
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac

CUDA_DIR=$(find_cuda_home)
if [[ -n "$CUDA_DIR" ]]; then
    CUDA_MAJOR=$("$CUDA_DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    [[ -n "$CUDA_MAJOR" ]] || die "cannot read the CUDA version of $CUDA_DIR/bin/nvcc"
    WANT_NCCL=1
    FLAVOUR="Gloo + NCCL, CUDA $CUDA_MAJOR from $CUDA_DIR"
    WHEEL_FLAVOUR="nccl-cu$CUDA_MAJOR"
    NCCL_DIST="nvidia-nccl-cu$CUDA_MAJOR"
else
    CUDA_MAJOR=
    WANT_NCCL=0
    FLAVOUR="Gloo, CPU only"
    WHEEL_FLAVOUR=gloo
fi

# The check that decides whether there is anything to do. Run in a clean Horovod environment so
# that launcher variables from a caller (e.g. inside horovodrun) do not make init() wait for peers.
hvd_ok() {
    env -u HOROVOD_RANK -u HOROVOD_SIZE -u HOROVOD_CONTROLLER -u HOROVOD_CPU_OPERATIONS \
        -u HOROVOD_GLOO_RENDEZVOUS_ADDR -u HOROVOD_GLOO_RENDEZVOUS_PORT \
        TF_CPP_MIN_LOG_LEVEL=3 "$PY" - "$HVD_VERSION" "$SOK_PATCH_LEVEL" "$WANT_NCCL" \
        <<'EOF' >/dev/null 2>&1
import sys
import horovod
assert horovod.__version__ == sys.argv[1], horovod.__version__
from horovod import _sok_build
assert _sok_build.PATCH_LEVEL == int(sys.argv[2])
import tensorflow as tf
assert _sok_build.TF_VERSION == tf.__version__
import horovod.tensorflow as hvd
assert hvd.gloo_built()
if sys.argv[3] == "1":  # nvcc found: a Gloo-only build is not enough
    assert _sok_build.NCCL and hvd.nccl_built()
hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0
with tf.device("/cpu:0"):
    assert int(hvd.allreduce(tf.constant([2.0]), op=hvd.Sum).numpy()[0]) == 2
EOF
}

if [[ "${SOK_HOROVOD_REBUILD:-0}" != 1 ]] && hvd_ok; then
    log "horovod $HVD_VERSION (TensorFlow; $FLAVOUR) already works with $PY: nothing to do"
    exit 0
fi

PIP=("$PY" -m pip --disable-pip-version-check --no-input)
"${PIP[@]}" --version >/dev/null 2>&1 || die "pip is not available for $PY"

TF_VERSION=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
    || die "TensorFlow is not importable with $PY; install it first"
PY_TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
log "python $PY ($PY_TAG), tensorflow $TF_VERSION; horovod with $FLAVOUR"

# ---------------------------------------------------------------- NCCL flavour: TF GPU build, NCCL
if [[ $WANT_NCCL == 1 ]]; then
    # (tensorflow and tensorflow-cpu install the same files: ask the files, not pip's records)
    if [[ $(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.test.is_built_with_cuda())' \
            2>/dev/null) != True ]]; then
        die "Horovod with NCCL (nvcc found in $CUDA_DIR) does not load into tensorflow-cpu. Install
  TensorFlow's GPU build (it runs without a GPU too), e.g.
    $PY -m pip uninstall -y tensorflow-cpu && $PY -m pip install --force-reinstall tensorflow==$TF_VERSION
  or build Horovod without NCCL: SOK_HOROVOD_GPU=0 bash $0 $PY"
    fi
    nccl_dir() {  # the wheel's nvidia/nccl (include/nccl.h, lib/libnccl.so.2)
        "$PY" - "$NCCL_DIST" <<'EOF' 2>/dev/null
import importlib.metadata as m, pathlib, sys
d = pathlib.Path(m.distribution(sys.argv[1]).locate_file("nvidia/nccl")).resolve()
assert (d / "include" / "nccl.h").is_file() and (d / "lib" / "libnccl.so.2").is_file()
print(d)
EOF
    }
    if ! NCCL_DIR=$(nccl_dir); then
        log "pip install $NCCL_DIST (NCCL's header and libnccl.so.2)"
        "${PIP[@]}" install -q "$NCCL_DIST"
        NCCL_DIR=$(nccl_dir) || die "$NCCL_DIST has no nvidia/nccl/{include/nccl.h,lib/libnccl.so.2}"
    fi
    log "NCCL: $NCCL_DIR"
fi

CACHE_ROOT=${SOK_CACHE_DIR:-$HOME/.cache/sok}
WHEEL_DIR="$CACHE_ROOT/wheels/horovod-$HVD_VERSION-sok$SOK_PATCH_LEVEL-$WHEEL_FLAVOUR-tf$TF_VERSION-$PY_TAG"
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
    log "done: horovod $HVD_VERSION ($FLAVOUR) works with $PY"
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
"$PY" - "$SRC" "$SOK_PATCH_LEVEL" "$TF_VERSION" "$WANT_NCCL" "$CUDA_MAJOR" <<'EOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])
want_nccl = sys.argv[4] == "1"

def patch(rel, old, new, count=1):
    p = src / rel
    text = p.read_text()
    n = text.count(old)
    if n != count:
        sys.exit(f"patch for {rel} does not apply ({n} matches of {old!r}, expected {count})")
    p.write_text(text.replace(old, new))
    print(f"[install_horovod] patched {rel}", file=sys.stderr)

# 1. XLA custom-call ops: their headers are not in TF 2.21's wheel.
patch("horovod/tensorflow/CMakeLists.txt",
      'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n',
      '# (sok) xla_mpi_ops.cc dropped: TF 2.21 wheel lacks its XLA headers\n')

# 2. CPU flavour: never pick up a local nvcc / CUDA toolkit.
if not want_nccl:
    patch("CMakeLists.txt",
          "include(CheckLanguage)\ncheck_language(CUDA)\nif(NOT CMAKE_CUDA_COMPILER)\n",
          "include(CheckLanguage)\n# (sok) CPU-only build: CUDA detection disabled\n"
          "set(CMAKE_CUDA_COMPILER \"\")\nif(FALSE)\n")

# 3. Gloo controller: size global_ranks_ before allgathering into it (else size() == 0 and the
#    stall inspector can never report or shut down on a stalled rank).
patch("horovod/common/gloo/gloo_controller.cc",
      "  global_ranks_.reserve(size_);\n",
      "  global_ranks_.resize(size_);  // (sok) was reserve(): size() stayed 0\n")

# 4. TensorFlow GPU ops (compiled in the NCCL flavour only): TF 2.21 does not export
#    stream_executor::gpu::AsGpuStreamValue; take the CUDA stream from the TF Stream itself.
mpi_ops = "horovod/tensorflow/mpi_ops.cc"
patch(mpi_ops,
      "// Forward declaration of AsGpuStreamValue\n"
      "namespace stream_executor {\nnamespace gpu {\n"
      "GpuStreamHandle AsGpuStreamValue(Stream* stream);\n"
      "} // namespace stream_executor\n} // namespace gpu\n",
      "")
patch(mpi_ops,
      '#include "tensorflow/stream_executor/stream.h"\n#endif // TENSORFLOW_VERSION >= 2011000000\n',
      '#include "tensorflow/stream_executor/stream.h"\n#endif // TENSORFLOW_VERSION >= 2011000000\n'
      "// (sok) TF 2.21 does not export AsGpuStreamValue: the CUDA stream of a TF Stream.\n"
      "static inline GpuStreamHandle SokGpuStream(stream_executor::Stream* stream) {\n"
      "  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\n"
      "}\n")
patch(mpi_ops, "stream_executor::gpu::AsGpuStreamValue(", "SokGpuStream(", count=12)

# 5. NCCL from the nvidia-nccl wheel, which has libnccl.so.2 but no libnccl.so; the TensorFlow
#    library looks for it in the same site-packages first, with no build-tree paths.
patch("cmake/Modules/FindNCCL.cmake",
      '    set(NCCL_LIBNAME "nccl")\n',
      '    set(NCCL_LIBNAME "nccl" "libnccl.so.2")  # (sok) the nvidia-nccl wheel has no libnccl.so\n')
patch("horovod/tensorflow/CMakeLists.txt",
      'set_target_properties(${TF_TARGET_LIB} PROPERTIES OUTPUT_NAME "mpi_lib")\n',
      'set_target_properties(${TF_TARGET_LIB} PROPERTIES OUTPUT_NAME "mpi_lib")\n'
      "# (sok) libnccl.so.2 of the nvidia-nccl wheel beside horovod in site-packages, else the\n"
      "# system's; RUNPATH, not RPATH, so that LD_LIBRARY_PATH still comes first.\n"
      "if(HAVE_NCCL)\n"
      "    set_target_properties(${TF_TARGET_LIB} PROPERTIES BUILD_WITH_INSTALL_RPATH TRUE\n"
      '                          INSTALL_RPATH "$ORIGIN/../../nvidia/nccl/lib")\n'
      '    target_link_options(${TF_TARGET_LIB} PRIVATE "LINKER:--enable-new-dtags")\n'
      "endif()\n")

# Build marker checked by the "already installed" test of tools/install_horovod.sh.
(src / "horovod" / "_sok_build.py").write_text(
    f"# Written by sparse_operation_kit tools/install_horovod.sh\n"
    f"PATCH_LEVEL = {int(sys.argv[2])}\nTF_VERSION = {sys.argv[3]!r}\n"
    f"NCCL = {want_nccl}  # HOROVOD_GPU_OPERATIONS=NCCL (Gloo for CPU tensors either way)\n"
    f"CUDA_MAJOR = {int(sys.argv[5]) if want_nccl else None}\n")
EOF

# ---------------------------------------------------------------- build
for v in $(env | sed -n 's/^\(HOROVOD_[A-Z_]*\)=.*/\1/p'); do
    case "$v" in HOROVOD_BUILD_JOBS|HOROVOD_BUILD_CUDA_CC_LIST) ;; *) unset "$v" ;; esac
done
JOBS=${HOROVOD_BUILD_JOBS:-$(nproc)}
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO \
       HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
if [[ $WANT_NCCL == 1 ]]; then
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_DIR" \
           HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include" HOROVOD_NCCL_LIB="$NCCL_DIR/lib" \
           HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-90}"
fi
export HOROVOD_CMAKE=$(command -v cmake)
export CMAKE_POLICY_VERSION_MINIMUM=3.5
export MAKEFLAGS="-j$JOBS"

log "building horovod $HVD_VERSION wheel ($FLAVOUR) with $JOBS jobs (takes minutes; log: $BUILD_ROOT/build.log)"
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
cp "$BUILD_ROOT/build.log" "$WHEEL_DIR/build.log"   # kept for reference
install_wheel "$WHEEL_DIR/$(basename "$WHL")"
