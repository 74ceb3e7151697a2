"""ninfer-bench (and ninfer --bench) on the cpu reference path with models/kjv: the tests a flag
list makes, the three output formats, the numbers' consistency (tok/s from the runs, GB/s over the
copy bandwidth of the same run), the prefill piece that does not depend on the other tests, mtp
rows with their acceptance, and one clear stderr line with exit 1 for every bad input. timings
are not checked against any speed (timed tests are not ci tests)."""
import csv
import io
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, os.environ.get("NINFER_BIN", "build/test/ninfer"))
BENCH = os.path.join(os.path.dirname(BIN), "ninfer-bench")
KJV = os.path.join(ROOT, "models/kjv/kjv.ninfer")

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="build the cli first")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.fixture(scope="module", autouse=True)
def bench_link():
    # the third name of the binary, as make builds it beside the cli
    if not os.path.islink(BENCH):
        if os.path.exists(BENCH):
            os.remove(BENCH)
        os.symlink(os.path.basename(BIN), BENCH)


def bench(*args, exe=None):
    return subprocess.run([exe or BENCH, *args], capture_output=True, text=True, timeout=300, env=ENV)


def rows_of(*args):
    r = bench(KJV, "--cpu", *args, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_table_default_tests_and_stderr_summary():
    r = bench(KJV, "--cpu", "-p", "64", "-n", "8", "-r", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    assert lines[0].startswith("| model | backend | kv | test | t/s | ms | GB/s | copy |")
    assert len(lines) == 4  # header, rule, pp64, tg8
    assert "| pp64 |" in lines[2] and "| tg8 |" in lines[3]
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert cells[1] == "cpu" and cells[2] == "f32"
        mean, sd = cells[4].split(" ± ")
        assert float(mean) > 0 and float(sd) >= 0
        assert cells[7].endswith("%")
    assert "copy bandwidth" in r.stderr and "GB/s" in r.stderr  # the run's ceiling, on stderr only


def test_json_rows_are_consistent():
    rows = rows_of("-p", "32,48", "-n", "4", "-pg", "16,4", "-d", "0,40", "-r", "3", "--warmup", "0")
    assert [x["test"] for x in rows] == ["pp32", "pp48", "tg4", "pp16+tg4",
                                         "pp32 @ d40", "pp48 @ d40", "tg4 @ d40", "pp16+tg4 @ d40"]
    for x in rows:
        assert x["backend"] == "cpu" and x["kv"] == "f32" and x["spec"] is None and x["sampling"] == "greedy"
        assert x["reps"] == 3 and x["warmup"] == 0 and len(x["samples_ts"]) == 3
        assert abs(sum(x["samples_ts"]) / 3 - x["avg_ts"]) <= 1e-3 * x["avg_ts"] + 2e-3
        assert x["copy_gbs"] > 0 and x["gbs"] > 0
        assert x["copy_fraction"] == pytest.approx(x["gbs"] / x["copy_gbs"], rel=1e-2)
        # the mean time and the token count give the rate of the mean run
        n = x["n_prompt"] + x["n_gen"]
        assert n / (x["avg_ms"] / 1e3) == pytest.approx(x["avg_ts"], rel=0.5)
    assert {(x["n_prompt"], x["n_gen"], x["n_depth"]) for x in rows} == {
        (32, 0, 0), (48, 0, 0), (0, 4, 0), (16, 4, 0), (32, 0, 40), (48, 0, 40), (0, 4, 40), (16, 4, 40)}


def test_csv_matches_its_header():
    r = bench(KJV, "--cpu", "-p", "16", "-n", "4", "-r", "2", "-o", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["test"] for x in rows] == ["pp16", "tg4"]
    for x in rows:
        assert x["device"].startswith("cpu, ") and x["backend"] == "cpu"
        assert float(x["avg_ts"]) > 0 and float(x["copy_gbs"]) > 0 and x["acceptance"] == ""
        assert int(x["reps"]) == 2 and x["sampling"] == "greedy"


def test_bench_flag_of_the_cli_is_the_same_mode():
    r = subprocess.run([BIN, "--bench", KJV, "--cpu", "-p", "16", "-n", "0", "-r", "1", "-o", "json"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    assert [x["test"] for x in json.loads(r.stdout)] == ["pp16"]


def test_prefill_piece_does_not_depend_on_the_other_tests():
    # a depth test alone used to prefill in pieces of the largest prompt test (1 token without
    # one); the piece is --prefill-chunk whatever is listed
    alone = rows_of("-p", "0", "-n", "2", "-d", "300", "--prefill-chunk", "128", "-r", "1")
    mixed = rows_of("-p", "200", "-n", "2", "-d", "300", "--prefill-chunk", "128", "-r", "1")
    assert alone[0]["prefill_chunk"] == 128 and all(x["prefill_chunk"] == 128 for x in mixed)
    dflt = rows_of("-p", "0", "-n", "2", "-d", "1500", "-r", "1")
    assert dflt[0]["prefill_chunk"] == 1024  # the cli's default


def test_sampling_and_mtp_rows():
    rows = rows_of("-p", "0", "-n", "16", "-r", "1", "--sample")
    assert rows[0]["sampling"] == "default"
    rows = rows_of("-p", "16", "-n", "16", "-r", "2", "--spec", "mtp", "--draft-tokens", "2")
    pp, tg = rows
    assert pp["spec"] == {"method": "mtp", "draft_tokens": 2, "lm_head_draft": False}
    assert "acceptance" not in pp  # no generation, no rounds
    assert 0 < tg["rounds"] <= 16 and 0 < tg["drafted"] <= 2 * tg["rounds"]
    assert 0 <= tg["accepted"] <= tg["drafted"] and tg["acceptance"] == pytest.approx(tg["accepted"] / tg["drafted"], abs=1e-4)
    r = bench(KJV, "--cpu", "-p", "0", "-n", "8", "-r", "1", "--spec", "mtp", "--draft-tokens", "3", "--lm-head-draft")
    assert r.returncode == 0, r.stderr
    assert "accept |" in r.stdout.split("\n")[0] and "mtp K=3 (draft head)" in r.stderr


def test_help():
    r = bench("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: ninfer-bench") and "-pg P,G" in r.stdout and "-o table|json|csv" in r.stdout
    assert "ninfer-bench" in subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize("args,needle", [
    (["-p", "abc"], "-p: 'abc' is not an integer"),
    (["-p", ""], "-p: empty list"),
    (["-p", "16,,32"], "has an empty item"),
    (["-n", "-4"], "-n: -4 is outside"),
    (["-pg", "16"], "-pg: '16' is not a pair"),
    (["-pg", "16,0"], "-pg: 0 is outside"),
    (["-r", "0"], "-r: 0 is outside"),
    (["--warmup", "x"], "--warmup: 'x' is not an integer"),
    (["-o", "xml"], "-o: 'xml' is not one of table, json, csv"),
    (["-d"], "-d needs a value"),
    (["--draft-tokens", "2"], "--draft-tokens needs --spec"),
    (["--spec", "mtp"], "--spec mtp needs --draft-tokens"),
    (["--spec", "dflash", "--draft-tokens", "2"], "--spec: 'dflash' is not supported"),
    (["--lm-head-draft"], "--lm-head-draft needs --spec"),
    (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens: 6 is outside [1, 5]"),
    (["--spec", "mtp", "--draft-tokens", "2", "-p", "16", "-d", "32"], "-d 32 with --spec"),
    (["-p", "0", "-n", "0"], "no tests"),
    (["--kv-dtype", "int8"], "--kv-dtype int8 / fp8 are gpu kv formats"),
    (["--kv-dtype", "q4"], "--kv-dtype: 'q4' is not one of"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
    (["extra.ninfer"], "unexpected argument 'extra.ninfer'"),
])
def test_bad_input_is_one_line_and_exit_1(args, needle):
    r = bench(KJV, "--cpu", *args)
    assert r.returncode == 1, (args, r.stderr)
    assert r.stdout == ""
    assert needle in r.stderr, r.stderr
    assert "error" in r.stderr.splitlines()[0]


def test_missing_model_and_no_model():
    r = bench("no/such/model.ninfer", "--cpu")
    assert r.returncode == 1 and r.stdout == "" and "no/such/model.ninfer" in r.stderr
    r = bench()
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("usage: ninfer-bench")
