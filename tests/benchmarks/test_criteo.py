"""The Criteo benchmark (benchmarks/criteo): TSV reader, synthetic generator, AUC, and a short
training run that must learn.

    PYTHONPATH=addons/sparse_operation_kit/python .venv/bin/python -m pytest tests/benchmarks -q
"""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "criteo"))
try:
    import sparse_operation_kit  # noqa: F401
except ImportError:  # source tree without PYTHONPATH
    sys.path.insert(0, os.path.join(ROOT, "addons", "sparse_operation_kit", "python"))

import data as criteo_data  # noqa: E402
import model as criteo_model  # noqa: E402
import report  # noqa: E402

SLICE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "criteo_slice.tsv")


def _slice_fields():
    with open(SLICE) as f:
        return [line.rstrip("\n").split("\t") for line in f]


# ---------------------------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------------------------
def test_reader_parses_the_real_slice():
    fields = _slice_fields()
    assert len(fields) == 200 and all(len(r) == 40 for r in fields)
    raw = criteo_data.read_tsv_raw(SLICE)
    assert (
        raw.labels.shape == (200,) and raw.dense.shape == (200, 13) and raw.cat.shape == (200, 26)
    )
    # Against a plain-Python reading of every field.
    for i, r in enumerate(fields):
        assert raw.labels[i] == int(r[0])
        for j in range(13):
            if r[1 + j] == "":
                assert np.isnan(raw.dense[i, j])
            else:
                assert raw.dense[i, j] == int(r[1 + j])
        for j in range(26):
            s = r[14 + j]
            assert raw.cat[i, j] == (-1 if s == "" else int(s, 16))
    # Known values of the first and third lines (Criteo train.txt lines 1 and 3).
    assert raw.labels[0] == 0 and raw.dense[0, 4] == 1382 and np.isnan(raw.dense[0, 11])
    assert raw.cat[0, 0] == 0x68FD1E64 and raw.cat[0, 25] == 0x9727DD16 and raw.cat[0, 21] == -1
    assert raw.cat[2, 23] == 0x3B183C5C and raw.cat[2, 24] == -1 and raw.cat[2, 25] == -1
    # Empty fields: the slice has some in both kinds.
    n_empty_dense = sum(r[1 + j] == "" for r in fields for j in range(13))
    n_empty_cat = sum(r[14 + j] == "" for r in fields for j in range(26))
    assert n_empty_dense > 0 and n_empty_cat > 0
    assert np.isnan(raw.dense).sum() == n_empty_dense and (raw.cat == -1).sum() == n_empty_cat
    assert raw.dense[~np.isnan(raw.dense)].min() < 0  # I2 has negative counts in Criteo
    # Writing the rows back gives the file's bytes.
    with open(SLICE) as f:
        assert criteo_data.to_tsv_lines(raw) == f.readlines()


def test_featurize():
    batch = criteo_data.read_tsv(SLICE)
    raw = criteo_data.read_tsv_raw(SLICE)
    assert (
        batch.dense.dtype == np.float32
        and batch.ids.dtype == np.int64
        and batch.labels.dtype == np.float32
    )
    expect = np.log1p(np.maximum(np.nan_to_num(raw.dense, nan=0.0), 0.0))
    np.testing.assert_allclose(batch.dense, expect, rtol=1e-6)
    assert (batch.dense[np.isnan(raw.dense)] == 0).all() and (batch.dense >= 0).all()
    assert (batch.ids == raw.cat).all()
    assert abs(batch.labels.mean() - 0.22) < 0.01


@pytest.mark.parametrize(
    "line, message",
    [
        ("1\t2\t3\n", "3 tab-separated fields"),
        ("2" + "\t" * 39 + "\n", "label"),
        ("0" + "\t" * 13 + "\txyz" + "\t" * 25 + "\n", "not a hex string"),
        ("0" + "\t" * 13 + "\t123456789" + "\t" * 25 + "\n", "more than 8 hex digits"),
        ("0\tabc" + "\t" * 38 + "\n", "bad integer"),
    ],
)
def test_reader_rejects_malformed_lines(line, message):
    with pytest.raises(ValueError, match=message):
        criteo_data.parse_lines([line])


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------
def test_generator_is_deterministic():
    a = criteo_data.SyntheticCriteo(seed=7)
    b = criteo_data.SyntheticCriteo(seed=7)
    text_a = "".join(a.tsv_lines(0, 100, 3000)).encode()
    text_b = "".join(b.tsv_lines(0, 100, 3000)).encode()
    assert text_a == text_b
    # Any batching gives the same rows (rows straddle the generator's internal blocks).
    start = a.BLOCK - 1000
    whole = a.raw(1, start, 3000)
    parts = criteo_data.concat_raw([a.raw(1, start, 1234), a.raw(1, start + 1234, 1766)])
    for x, y in zip(whole, parts):
        np.testing.assert_array_equal(x, y)
    # Other seeds and other splits differ.
    assert "".join(criteo_data.SyntheticCriteo(seed=8).tsv_lines(0, 100, 3000)).encode() != text_a
    assert not np.array_equal(a.raw(1, 0, 1000).cat, a.raw(0, 0, 1000).cat)


@pytest.mark.parametrize("workers", [1, 3])
def test_generator_batches_block_by_block_like_one_pass(workers):
    gen = criteo_data.SyntheticCriteo(seed=5)
    start, n = gen.BLOCK - 700, 2 * gen.BLOCK + 1500  # a partial block at either end
    got = gen.batch(0, start, n, workers=workers)
    want = criteo_data.featurize(gen.raw(0, start, n))
    for name, x, y in zip(criteo_data.Batch._fields, got, want):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert all(len(a) == 0 for a in gen.batch(0, 10, 0))


def test_generator_writes_criteo_lines_the_reader_reads_back():
    gen = criteo_data.SyntheticCriteo(seed=3)
    raw = gen.raw(0, 0, 2000)
    lines = gen.tsv_lines(0, 0, 2000)
    assert all(len(line.rstrip("\n").split("\t")) == 40 for line in lines)
    cats = [f for line in lines for f in line.rstrip("\n").split("\t")[14:]]
    assert all(f == "" or (len(f) == 8 and int(f, 16) >= 0) for f in cats)
    back = criteo_data.parse_lines(lines)
    np.testing.assert_array_equal(back.labels, raw.labels)
    np.testing.assert_array_equal(back.cat, raw.cat)
    np.testing.assert_array_equal(back.dense, raw.dense)  # NaN (empty) in the same places
    assert criteo_data.to_tsv_lines(back) == lines


def test_generator_is_criteo_like():
    gen = criteo_data.SyntheticCriteo(seed=0)
    raw = gen.raw(0, 0, 60000)
    assert abs(raw.labels.mean() - 0.22) < 0.015
    distinct = [len(np.unique(raw.cat[:, f])) for f in range(26)]
    assert (
        min(distinct) <= 5 and max(distinct) > 10000
    )  # vocabularies from a few values to millions
    # Power law: in a large field the most frequent value is far above the median one.
    _, counts = np.unique(raw.cat[:, 2][raw.cat[:, 2] >= 0], return_counts=True)
    assert counts.max() > 100 * np.median(counts)
    assert 0.3 < np.isnan(raw.dense[:, 0]).mean() < 0.6 and (raw.cat == -1).any()
    # The label depends on the features: the hidden model's own AUC is high.
    p = gen.logits(raw.dense, raw.cat)
    assert criteo_model.auc(raw.labels, p) > 0.8


# ---------------------------------------------------------------------------------------------
# AUC
# ---------------------------------------------------------------------------------------------
def _auc_pairs(labels, scores):
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / (len(pos) * len(neg))


def test_auc_exact_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    scores = rng.integers(0, 20, 500).astype(np.float32)  # many ties
    assert criteo_model.auc(labels, scores) == pytest.approx(_auc_pairs(labels, scores), abs=1e-12)
    assert criteo_model.auc([0, 1], [0.1, 0.9]) == 1.0
    assert criteo_model.auc([0, 1], [0.9, 0.1]) == 0.0
    assert criteo_model.auc([0, 1, 0, 1], [0.5] * 4) == 0.5


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def test_short_training_run_learns(capsys, tmp_path):
    import run as criteo_run

    result = criteo_run.main(
        [
            "--out_dir",
            str(tmp_path),
            "--no_plot",
            "--steps",
            "80",
            "--batch_size",
            "512",
            "--synthetic_eval_samples",
            "16384",
            "--warmup_steps",
            "5",
            "--bottom_mlp",
            "32",
            "--top_mlp",
            "64",
            "--seed",
            "1",
            "--log_every",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert "RESULT " in out and "eval_auc=" in out
    assert result["train_loss"] < result["train_loss_first"] - 0.02
    assert result["eval_auc"] > 0.6
    assert np.isfinite(result["eval_loss"]) and result["eval_loss"] < 0.6
    assert result["samples_per_sec"] > 0 and result["table_rows"] > 0


def test_eval_gathers_under_horovod_are_sok_gathers_after_the_lookups(monkeypatch):
    """Under Horovod the evaluation gathers its logits and labels with sok.all_gather in the
    chain of lookups that do not train, which runs them after SOK's exchange of the eval lookups
    on every rank (tests/distributed checks that order). Horovod's gather of the labels, free to
    run before SOK's exchange on one rank and after it on the other, hung both ranks on 2 GPUs."""
    import graph as criteo_graph
    import run as criteo_run
    import tensorflow as tf

    import sparse_operation_kit as sok

    class OneRankHorovod:  # what the graph asks of Horovod, as one rank
        @staticmethod
        def size():
            return 1

        @staticmethod
        def allgather(t):
            raise AssertionError("the evaluation gathers with Horovod's allgather")

        @staticmethod
        def broadcast_variables(variables, root_rank):
            return tf.no_op()

    calls = []

    def all_gather(tensors, training=False):
        calls.append((list(tensors), training))
        return [tf.identity(t, name="gathered") for t in tensors]

    monkeypatch.setattr(sok, "all_gather", all_gather)
    args = criteo_run.parse_args(["--bottom_mlp", "8", "--top_mlp", "8", "--num_tables", "2"])
    g = criteo_graph.Graph(args, OneRankHorovod)
    assert len(calls) == 1, calls
    tensors, training = calls[0]
    assert tensors[0] is g.eval_logits and training is False
    assert [t.op.name.split("/")[-1].rstrip("_0123456789") for t in g.eval_out] == ["gathered"] * 2


@pytest.mark.parametrize(
    "tables,batch",
    [
        ([], "256"),
        (["--num_tables", "4"], "250"),
        (["--synthetic_train_samples", "700"], "250"),
        (["--data", SLICE, "--eval_data", SLICE], "64"),
    ],
)
def test_tf_data_and_resident_inputs_train_exactly_like_feed_dict(capsys, tmp_path, tables, batch):
    """The tf.data input (one id tensor per field), the resident one (the split in device memory,
    its epoch's order there too, rows gathered in the graph) and feed_dict (an [B, 26] matrix)
    train the same model bit for bit, with a table per field and with tables shared by fields,
    over one epoch and over several (6 of 2 batches, the last 200 rows unused; 4 shuffled ones of
    3 batches of real rows). A batch of 250 ids per field (not a multiple of 8) takes the resident
    split's copying path, 256 its aliasing one."""
    import run as criteo_run

    common = tables + [
        "--out_dir",
        str(tmp_path),
        "--no_plot",
        "--steps",
        "12",
        "--batch_size",
        batch,
        "--synthetic_eval_samples",
        "4096",
        "--warmup_steps",
        "2",
        "--bottom_mlp",
        "16",
        "--top_mlp",
        "16",
        "--seed",
        "3",
        "--log_every",
        "0",
    ]
    fed = criteo_run.main(common + ["--input", "feed"])
    streamed = criteo_run.main(common + ["--input", "dataset"])
    assert "input=dataset" in capsys.readouterr().out
    resident = criteo_run.main(common + ["--input", "resident"])
    assert "input=resident" in capsys.readouterr().out
    for key in ("train_loss_first", "train_loss", "eval_loss", "eval_auc", "table_rows"):
        assert streamed[key] == fed[key], key
        assert resident[key] == fed[key], key


@pytest.mark.parametrize("source", ["dataset", "resident"])
def test_profile_traces_steps_after_what_it_reports(capsys, tmp_path, source):
    """--profile prints its stage table, and the run reports the same training and evaluation as
    without it (the traced steps come after the evaluation; with resident input they run past the
    one epoch, wrapping around in its order)."""
    import run as criteo_run

    common = ["--out_dir", str(tmp_path), "--no_plot", "--steps", "6", "--batch_size", "256",
              "--synthetic_eval_samples", "2048", "--warmup_steps", "2", "--bottom_mlp", "16",
              "--top_mlp", "16", "--seed", "5", "--log_every", "0", "--input", source]
    plain = criteo_run.main(common)
    capsys.readouterr()
    profiled = criteo_run.main(common + ["--profile"])
    out = capsys.readouterr().out
    assert "profile:    traced step" in out and "embedding forward" in out
    assert out.index("profile:    traced step") > out.index("device:")
    for key in ("train_loss_first", "train_loss", "eval_loss", "eval_auc", "table_rows"):
        assert profiled[key] == plain[key], key


def test_training_with_shared_tables_and_adam(capsys, tmp_path):
    import run as criteo_run

    # 26 fields over 4 tables, Adam, and the synthetic rows routed through TSV text and the reader.
    result = criteo_run.main(
        [
            "--out_dir",
            str(tmp_path),
            "--no_plot",
            "--steps",
            "60",
            "--batch_size",
            "512",
            "--synthetic_eval_samples",
            "8192",
            "--warmup_steps",
            "5",
            "--bottom_mlp",
            "32",
            "--top_mlp",
            "64",
            "--num_tables",
            "4",
            "--optimizer",
            "adam",
            "--learning_rate",
            "0.003",
            "--log_every",
            "0",
            "--synthetic_via_tsv",
        ]
    )
    assert result["train_loss"] < result["train_loss_first"] - 0.02
    assert result["eval_auc"] > 0.65


def test_min_count_maps_rare_ids():
    B = criteo_data.Batch
    z = np.zeros([1, 13], np.float32)
    ids = np.array([[5] * 26, [5] * 26, [7] * 26, [-1] * 26], np.int64)
    train = B(np.zeros(4, np.float32), np.repeat(z, 4, 0), ids)
    evals = B(
        np.zeros(3, np.float32),
        np.repeat(z, 3, 0),
        np.array([[5] * 26, [7] * 26, [9] * 26], np.int64),
    )
    t2, (e2,) = criteo_data.apply_min_count(train, [evals], 2)
    assert (t2.ids[:, 0] == [5, 5, criteo_data.RARE_ID, criteo_data.MISSING_ID]).all()
    assert (e2.ids[:, 3] == [5, criteo_data.RARE_ID, criteo_data.RARE_ID]).all()
    assert (train.ids[2] == 7).all()  # inputs untouched


# ---------------------------------------------------------------------------------------------
# The job as a product: arguments, --help, metrics file, plot, checkpoint and serving export
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
        (["--batch_size", "0"], "argument --batch_size: must be a positive integer, got 0"),
        (["--batch_size", "-5"], "argument --batch_size: must be a positive integer, got -5"),
        (
            ["--learning_rate", "nan"],
            "argument --learning_rate: must be a positive number, got nan",
        ),
        (
            ["--embedding_dim", "4.7"],
            "argument --embedding_dim: invalid _positive_int value: '4.7'",
        ),
        (["--num_tables", "27"], "argument --num_tables: invalid choice: 27"),
        (
            ["--bottom_mlp", "32,x"],
            "argument --bottom_mlp: must be comma-separated positive integers, got '32,x'",
        ),
        (
            ["--steps", "10", "--warmup_steps", "10"],
            "--warmup_steps 10 leaves no timed step out of --steps 10",
        ),
        (["--data", "/nonexistent/day_0.tsv"], "no such file: /nonexistent/day_0.tsv"),
        (
            ["--synthetic_train_samples", "100", "--batch_size", "512"],
            "smaller than one batch (--batch_size 512)",
        ),
    ],
)
def test_bad_arguments_are_refused_with_clear_messages(argv, message, capsys):
    import run as criteo_run

    with pytest.raises(SystemExit) as e:
        criteo_run.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_help_shows_defaults_without_loading_tensorflow():
    script = (
        "import sys, contextlib, io; sys.path.insert(0, sys.argv[1]); import run; buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try: run.parse_args(['--help'])\n"
        "    except SystemExit: pass\n"
        "print(buf.getvalue()); print('TF_LOADED', 'tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, os.path.join(ROOT, "benchmarks", "criteo")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "global batch size (default: 2048)" in out and "(default: adagrad)" in out
    assert "TF_LOADED False" in out


def test_metrics_file_plot_checkpoint_and_serving_export(tmp_path, capsys):
    import run as criteo_run

    out = tmp_path / "run"
    result = criteo_run.main(
        [
            "--steps",
            "24",
            "--batch_size",
            "256",
            "--synthetic_eval_samples",
            "4096",
            "--log_every",
            "5",
            "--eval_every",
            "8",
            "--bottom_mlp",
            "16",
            "--top_mlp",
            "16",
            "--seed",
            "2",
            "--save",
            "--out_dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "samples/s ETA" in printed and "eval at step 8: AUC" in printed

    records = report.read_metrics(out / "metrics.jsonl")
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "config" and kinds[-1] == "summary"
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [
        5,
        10,
        15,
        20,
        24,
    ]  # the last span (21..24) is recorded too
    assert all(np.isfinite(r["loss"]) and r["samples_per_sec"] > 0 for r in train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [8, 16, 24] and all(r["rows"] == 4096 for r in evals)
    assert evals[-1]["auc"] == result["eval_auc"] and records[-1]["eval_auc"] == result["eval_auc"]

    png = (out / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(out / "plot.png")).shape[:2] == (360, 1000)

    # The serving SavedModel keeps every row: its predictions on the evaluation split give the
    # run's AUC, and the checkpoint restores into the training graph with the same tables.
    import tensorflow as tf

    evals_batch = criteo_data.SyntheticCriteo(2).batch(1, 0, 4096)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(out / "serving"))
        sig = meta.signature_def["serving_default"]
        probs = sess.run(
            sig.outputs["probability"].name,
            {sig.inputs["dense"].name: evals_batch.dense, sig.inputs["ids"].name: evals_batch.ids},
        )
    assert probs.shape == (4096,)
    assert criteo_model.auc(evals_batch.labels, probs) == pytest.approx(
        result["eval_auc"], abs=1e-6
    )
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        saver = tf.compat.v1.train.import_meta_graph(str(out / "checkpoint" / "model.ckpt.meta"))
        saver.restore(sess, str(out / "checkpoint" / "model.ckpt"))
        restored = sess.run(
            tf.compat.v1.get_default_graph().get_tensor_by_name("probability:0"),
            {"dense:0": evals_batch.dense, "ids:0": evals_batch.ids},
        )
    np.testing.assert_allclose(restored, probs, rtol=1e-6)
