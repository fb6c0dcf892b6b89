"""nvcc for Bazel 4 (which has no CUDA rules): cuda_library compiles .cu files into a cc_library.

Each .cu is one nvcc action, compiled with -fPIC into a .pic.o that the cc_library takes in srcs,
so it links into shared libraries like any other object. Bazel runs the actions in parallel; that
is the only parallelism there is: with one virtual arch nvcc runs a single cicc + ptxas chain per
file, so its --threads has nothing to split. Without CUDA (see cuda_configure.bzl) the .cu files
are not compiled: the cc_library keeps only the headers and deps, and code that uses it guards
its CUDA parts with GOOGLE_CUDA.
"""

load("@local_config_cuda//:cuda.bzl", "CUDA_ENABLED", "NVCC")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

# sm_90 machine code plus compute_90 PTX (later GPUs JIT it).
CUDA_GENCODE = [
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
]

def _nvcc_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    srcs = ctx.files.srcs
    names = [src.basename for src in srcs]
    for name in ctx.attr.per_file_copts:
        if name not in names:
            # Loud on purpose: a renamed or split file would otherwise lose its flags silently.
            fail("%s: per_file_copts names %r, which is not among srcs %r" % (ctx.label, name, names))
    # Headers: ours and those of our deps in this workspace. nvcc finds CUDA's own headers in its
    # install dir, like the host compiler finds /usr/include: not inputs (2,000 files to sandbox).
    inputs = depset(ctx.files.hdrs, transitive = [
        dep[CcInfo].compilation_context.headers
        for dep in ctx.attr.deps
        if CcInfo in dep and not dep.label.workspace_name
    ] + [cc_toolchain.all_files])
    outs = []
    for src in srcs:
        stem = src.basename[:-len(src.extension) - 1]
        out = ctx.actions.declare_file("_nvcc/%s/%s.pic.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(ctx.attr.copts)
        args.add_all(ctx.attr.per_file_copts.get(src.basename, []))
        # nvcc's intermediate files beside the object: in the shared /tmp two sandboxed actions
        # (both PID 2 in their namespaces) name theirs alike and delete each other's.
        args.add("--objdir-as-tempdir")
        args.add("-x", "cu")
        args.add("-c", src)
        args.add("-o", out)
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = [args],
            inputs = depset([src], transitive = [inputs]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            # nvcc runs the host compiler and its own tools from PATH and its install dir.
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(),  # the headers of those in this workspace are inputs
        "copts": attr.string_list(),
        "per_file_copts": attr.string_list_dict(),
        "nvcc": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def cuda_library(name, srcs, hdrs = [], copts = [], per_file_copts = {}, deps = [], **kwargs):
    """A cc_library of the objects nvcc makes from srcs (.cu).

    Args:
      name: the cc_library.
      srcs: .cu files, one nvcc action each.
      hdrs: headers they include (inputs of every nvcc action; exported by the cc_library).
      copts: nvcc flags (before per_file_copts). The workspace root is on the include path.
      per_file_copts: {basename of a src: extra nvcc flags}; a name not in srcs fails the build.
      deps: deps of the cc_library (headers its users need, libraries to link); the headers of
        those in this workspace are inputs of the nvcc actions too.
      **kwargs: passed to the cc_library (visibility, linkstatic, ...).
    """
    objs = []
    if CUDA_ENABLED:
        _nvcc_objects(
            name = name + "_nvcc",
            srcs = srcs,
            hdrs = hdrs,
            copts = ["-I."] + copts,
            per_file_copts = per_file_copts,
            deps = deps,
            nvcc = NVCC,
            visibility = ["//visibility:private"],
        )
        objs = [":" + name + "_nvcc"]
    native.cc_library(
        name = name,
        srcs = objs,
        # .cuh: device code, for nvcc only (and not an extension cc_library accepts).
        hdrs = [h for h in hdrs if not h.endswith(".cuh")],
        deps = deps,
        **kwargs
    )
