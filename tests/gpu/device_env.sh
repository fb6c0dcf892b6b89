# Sourced on a device machine (after ../shared/tools/tf-gpu's device-setup.sh), from the project's
# root: TensorFlow's GPU build, the staged package (build/sok_pkg, tools/stage_gpu_package.sh) and
# Horovod for the device's Python (build/horovod: its cp312 wheel and its dependencies' wheels,
# tools/stage_gpu_package.sh --horovod), installed once into /tmp/hvdsite.
. /opt/tfgpu/env.sh
if [ ! -d /tmp/hvdsite/horovod ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/hvdsite build/horovod/*.whl
  # The wheel's horovodrun names the build machine's interpreter: one for this Python.
  mkdir -p /tmp/hvdsite/bin
  printf '#!/bin/sh\nexec python3 -c "from horovod.runner.launch import run_commandline; run_commandline()" "$@"\n' \
    > /tmp/hvdsite/bin/horovodrun
  chmod +x /tmp/hvdsite/bin/horovodrun
fi
export PYTHONPATH="$PWD/build/sok_pkg:/tmp/hvdsite${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/hvdsite/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=2
export NCCL_NVLS_ENABLE=0  # NVLink multicast off on these machines
