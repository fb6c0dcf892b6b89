"""Finds the installed TensorFlow (headers and libtensorflow_framework) through the configured python.

Everything TensorFlow-version-specific about the build lives here and in tf/BUILD.tpl.
"""

_PYTHON_ENV = "PYTHON_BIN_PATH"

def _python(repository_ctx):
    python = repository_ctx.os.environ.get(_PYTHON_ENV)
    if not python:
        python = repository_ctx.which("python3")
    if not python:
        fail("tf_configure: set %s (./configure.sh does) to a python with TensorFlow" % _PYTHON_ENV)
    return str(python)

def _run_python(repository_ctx, python, code):
    result = repository_ctx.execute([python, "-c", code], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.return_code != 0:
        fail("tf_configure: %s failed: %s" % (python, result.stderr))
    return result.stdout.strip().splitlines()[-1]

def _tf_configure_impl(repository_ctx):
    python = _python(repository_ctx)
    include = _run_python(repository_ctx, python, "import tensorflow as tf; print(tf.sysconfig.get_include())")
    lib = _run_python(repository_ctx, python, "import tensorflow as tf; print(tf.sysconfig.get_lib())")
    version = _run_python(repository_ctx, python, "import tensorflow as tf; print(tf.__version__)")
    flags = _run_python(repository_ctx, python, "import tensorflow as tf; print(' '.join(tf.sysconfig.get_compile_flags()))")
    repository_ctx.symlink(include, "include")
    repository_ctx.symlink(lib + "/libtensorflow_framework.so.2", "lib/libtensorflow_framework.so.2")
    defines = [f[2:] for f in flags.split(" ") if f.startswith("-D")]
    repository_ctx.template("BUILD", repository_ctx.attr._build_tpl, {
        "%{DEFINES}": repr(defines),
    })
    repository_ctx.file("version.bzl", "TF_VERSION = %r\nTF_DEFINES = %r\n" % (version, defines))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = [_PYTHON_ENV],
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/tf:BUILD.tpl"))},
)
