"""Maps user initializers (TensorFlow initializers, SOK 2.x strings, numbers) onto the core's
deterministic initial-value function (core/initializer.h)."""
import zlib

import numpy as np
import tensorflow as tf

from sparse_operation_kit.runtime.schema import InitKind

CONSTANT, UNIFORM, NORMAL = InitKind.CONSTANT, InitKind.UNIFORM, InitKind.NORMAL
TRUNCATED_NORMAL, MATRIX = InitKind.TRUNCATED_NORMAL, InitKind.MATRIX


class InitSpec:
    """kind, a, b, seed as core/initializer.h reads them; matrix only for MATRIX."""

    def __init__(self, kind: InitKind, a=0.0, b=0.0, seed=0, matrix=None):
        self.kind, self.a, self.b, self.seed, self.matrix = (
            kind,
            float(a),
            float(b),
            int(seed),
            matrix,
        )

    def __repr__(self):
        return f"InitSpec(kind={self.kind.value}, a={self.a}, b={self.b}, seed={self.seed})"


def name_seed(name):
    """A seed that depends only on the variable's name: the same on every rank and every run."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def _config(init):
    try:
        return init.get_config()
    except Exception:  # plain callables
        return {}


def _default_value_matrix(initializer, cfg, seed, rows, dim):
    """Evaluates `initializer` once into a [rows, dim] numpy matrix that is the same in every graph
    and process: a copy seeded from the table's seed runs in a private graph with a fixed seed
    (unseeded or op-seeded TensorFlow initializers would otherwise draw new values per call)."""
    if "seed" in cfg and hasattr(type(initializer), "from_config"):
        initializer = type(initializer).from_config(dict(cfg, seed=seed))
    with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(seed)
        value = initializer(shape=[rows, dim], dtype=tf.float32)
        with tf.compat.v1.Session(graph=graph) as sess:
            return np.asarray(sess.run(tf.convert_to_tensor(value, tf.float32)), np.float32)


def resolve(initializer, name, dim, default_value_dim):
    """Returns an InitSpec for `initializer` on a table `name` of dimension `dim`.

    Accepted: None (truncated normal, stddev 1/sqrt(dim), as TensorFlow's embedding columns;
    sok.get_embedding_variable passes DeepRec's stddev 1 instead), a number, the SOK
    2.x strings "random", "zeros", "ones" or a number as a string, TensorFlow/Keras initializers
    (constant, uniform, normal, truncated normal are computed on the fly; any other initializer
    or callable is evaluated once into a [default_value_dim, dim] matrix).
    """
    seed_default = name_seed(name)
    if initializer is None:
        return InitSpec(TRUNCATED_NORMAL, 0.0, 1.0 / np.sqrt(dim), seed_default)
    if isinstance(initializer, (int, float, np.floating, np.integer)):
        return InitSpec(CONSTANT, float(initializer))
    if isinstance(initializer, str):
        text = initializer.strip().lower()
        if text == "random":
            return InitSpec(UNIFORM, -0.05, 0.05, seed_default)
        if text in ("zeros", "zero"):
            return InitSpec(CONSTANT, 0.0)
        if text in ("ones", "one"):
            return InitSpec(CONSTANT, 1.0)
        try:
            return InitSpec(CONSTANT, float(text))
        except ValueError:
            raise ValueError(f"table '{name}': unknown initializer string '{initializer}' "
                             "(expected 'random', 'zeros', 'ones' or a number)") from None
    cls = type(initializer).__name__.lower().replace("_", "")
    cfg = _config(initializer)
    seed = cfg.get("seed")
    # A given seed alone, as Keras's and DeepRec's initializers: tables built under other names
    # (a model rebuilt from code) start from the same rows.
    seed = seed_default if seed is None else int(seed)
    if cls in ("zeros", "zerosinitializer"):
        return InitSpec(CONSTANT, 0.0)
    if cls in ("ones", "onesinitializer"):
        return InitSpec(CONSTANT, 1.0)
    if cls in ("constant", "constantinitializer") and np.ndim(cfg.get("value", 0)) == 0:
        return InitSpec(CONSTANT, float(cfg.get("value", 0.0)))
    if cls in ("randomuniform", "randomuniforminitializer"):
        return InitSpec(UNIFORM, cfg.get("minval", -0.05), cfg.get("maxval", 0.05), seed)
    if cls in ("randomnormal", "randomnormalinitializer"):
        return InitSpec(NORMAL, cfg.get("mean", 0.0), cfg.get("stddev", 0.05), seed)
    if cls in ("truncatednormal", "truncatednormalinitializer"):
        return InitSpec(TRUNCATED_NORMAL, cfg.get("mean", 0.0), cfg.get("stddev", 0.05), seed)
    if callable(initializer):
        rows = default_value_dim if default_value_dim > 0 else 4096
        return InitSpec(
            MATRIX, seed=seed, matrix=_default_value_matrix(initializer, cfg, seed, rows, dim)
        )
    raise TypeError(f"table '{name}': unsupported initializer {initializer!r}")
