package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**/*.h", "include/**/*.inc", "include/**"], exclude = ["include/**/*.py"]),
    includes = ["include"],
    defines = %{DEFINES},
)

cc_library(
    name = "libtensorflow_framework",
    srcs = ["lib/libtensorflow_framework.so.2"],
)
