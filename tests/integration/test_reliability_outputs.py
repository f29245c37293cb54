"""The second fault audit of docs/reliability.md, reproduced through the CLI: a shorter re-run into the folder of a
longer one, `validate` against what `train` refuses, a full disk during the export and a resume, kill -9 inside a
re-export and inside rotation, planted symlinks, secrets in the run's files, silent checkpoint damage, SIGINT
during the export, deep TOML and byte-identical LoRA exports."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import ROOT, STEP, args, flat, kill9, paused, start, steps_of

pytestmark = pytest.mark.slow


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) -> its sha256; folders -> "dir". The lock file is left out
    (each run writes its pid into it)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if rel == ".lock":
            continue
        if path.is_symlink():
            found[rel] = "link -> " + os.readlink(path)
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A finished 4-step run: checkpoints at steps 2 and 4 (with EMA), metrics of steps 1-4."""
    out = tmp_path_factory.mktemp("base") / "run"
    proc = start(args(out, 4))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert steps_of(out) == [2, 4]
    return out


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(base_run, target)
    return target


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    return run_cli


# --- 1. a shorter re-run never rewrites history --------------------------------------------------------------------
def test_a_shorter_rerun_is_exit_2_naming_the_checkpoint_step_and_writes_nothing(run_copy, cli):
    """The finished 4-step run re-run with `train.max_num_steps = 2` (its preset says `resume = true`): the old code
    resumed at step 4, trained nothing and wrote step 4's weights into step 2's checkpoint and the export."""
    before = snapshot(run_copy)
    code, out, err = cli(*args(run_copy, 2, "train.ckpt.export_safetensors=true"))
    assert code == 2 and "Traceback" not in err, err
    text = flat(err)
    assert (
        f"{run_copy}/checkpoints/{STEP(4)}isatstep4,pastthe2stepsthisrunplans(train.max_num_steps=2)" in text
    )
    assert (
        "`train.max_num_steps`toatleast4" in text
        and "train.output_dir" in text
        and "train.resume=false" in text
    )
    assert flat(f'train.resume = "{run_copy / "checkpoints" / STEP(2)}"') in text  # the rewind that fits
    assert "done:" not in out
    assert snapshot(run_copy) == before


def _docs_tensorboard_command() -> list[str]:
    """docs/logging.md's TensorBoard run, as typed."""
    text = (ROOT / "docs" / "logging.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("sanarl --config") and "tensorboard" in x]
    return shlex.split(line)


def test_the_docs_tensorboard_run_after_the_readme_run_trains_in_its_own_folder(tmp_path):
    """The README's first run (cut short here at 21 steps), then docs/logging.md's TensorBoard command in the same
    folder: it trains its 20 steps into its own output folder and logs scalars; the same command into the README
    run's folder (as the docs had it) stops with exit 2 naming step 21 and writes nothing."""
    env = {**os.environ, "COLUMNS": "300"}

    def sanarl(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "sanarl", *argv]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)

    first = sanarl("--config", "tiny-shapes-sft", "sanarl.datasets.shapes", "--set", "train.max_num_steps=21")
    assert first.returncode == 0, first.stderr[-3000:]
    readme_run = tmp_path / "outputs" / "tiny-shapes-sft"
    before = snapshot(readme_run)
    argv = _docs_tensorboard_command()[1:]
    second = sanarl(*argv)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done: 20 steps" in second.stdout
    events = list((tmp_path / "outputs" / "tiny-shapes-sft-tensorboard" / "tensorboard").rglob("events.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(events[0].parent)).Reload().Tags()["scalars"]
    assert "loss" in scalars
    assert snapshot(readme_run) == before
    own = argv.index(next(a for a in argv if a.startswith("train.output_dir=")))
    old_docs = argv[: own - 1] + argv[own + 1 :]  # without its own output folder
    third = sanarl(*old_docs)
    assert third.returncode == 2, third.stderr[-3000:]
    assert f"{STEP(21)}isatstep21,pastthe20steps" in flat(third.stderr)
    assert snapshot(readme_run) == before


# --- 2. validate refuses what train refuses or crashes on ------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "sets", "expect"),
    [
        (
            "tiny-shapes-sft",
            ["policy.diffusers.inference_size=[20000,20000]"],
            "GiBperrank(training)butthismachine",
        ),
        ("tiny-shapes-nft", ["rollout.num_candidates=-1"], "`rollout.num_candidates`=-1isoutofrange"),
        ("tiny-shapes-sft", ["train.resume={tmp}/nothing-here"], "holdsnocheckpoint"),
        (
            "tiny-shapes-nft",
            ["policy.diffusers.sample.num_steps=100000000"],
            "sample.num_steps`=100000000isoutofrange",
        ),
    ],
    ids=["inference_size_20000", "num_candidates_negative", "resume_no_checkpoint", "sample_steps_1e8"],
)
def test_validate_refuses_what_train_refuses_before_touching_data(
    cli, tmp_path, monkeypatch, preset, sets, expect
):
    """Each of these used to pass `sanarl validate` (the oversized one was OOM-killed rendering dataset item 0 at
    full size) and then stop `sanarl train` with a traceback or the memory plan. The plugin's dataset is never
    built: validate refuses from the config alone."""
    import sanarl.datasets.shapes as shapes

    monkeypatch.setattr(shapes, "get_dataset", lambda cfg: pytest.fail("validate built the dataset"))
    run = tmp_path / "run"
    sets = [s.replace("{tmp}", str(tmp_path)) for s in [*sets, f"train.output_dir={run}"]]
    for command in (["validate"], []):
        code, out, err = cli(
            *command, "--config", preset, "sanarl.datasets.shapes", *[x for s in sets for x in ("--set", s)]
        )
        assert code == 2 and "Traceback" not in err, out + err
        assert expect in flat(err)
        assert not run.exists()


def test_validate_refuses_a_resume_past_max_num_steps(run_copy, cli):
    code, _, err = cli("validate", *args(run_copy, 2))
    assert code == 2 and "Traceback" not in err, err
    assert f"{STEP(4)}isatstep4,pastthe2stepsthisrunplans" in flat(err)


# --- 5. a full disk during the export and at the start of a resume -------------------------------------------------
EXPORT = "train.ckpt.export_safetensors=true"


@pytest.fixture
def exported(run_copy, cli) -> Path:
    """The 4-step run re-run to its end with the export on: `export/` holds step 4's model."""
    code, _, err = cli(*args(run_copy, 4, EXPORT))
    assert code == 0, err
    assert (run_copy / "export").is_dir()
    return run_copy


def test_a_full_disk_during_the_export_is_exit_2_and_keeps_the_old_export(exported, cli, monkeypatch):
    """The old code left `export/transformer/` with only its config.json and a SafetensorError traceback."""
    before = snapshot(exported / "export")
    monkeypatch.setenv("SANARL_TEST_FAIL_AT", "export_write")
    code, _, err = cli(*args(exported, 6, EXPORT))
    assert code == 2 and "Traceback" not in err, err
    assert f"diskfullat{exported}:theexportwasnotwritten({exported}/exportisasitwas" in flat(err)
    assert snapshot(exported / "export") == before
    assert [p.name for p in exported.iterdir() if p.name.startswith(".") and p.name != ".lock"] == []


def test_a_full_disk_at_the_start_of_a_resume_is_exit_2_and_writes_nothing(run_copy, cli, monkeypatch):
    """The old code ended in an OSError traceback from resumes.jsonl. The temporary file a kill left beside
    config.toml is removed at the start."""
    before = snapshot(run_copy)
    (run_copy / ".config.toml.k9xq2a.tmp").write_text("left by a kill")
    monkeypatch.setenv("SANARL_TEST_FAIL_AT", "resume_record")
    code, _, err = cli(*args(run_copy, 6))
    assert code == 2 and "Traceback" not in err, err
    assert f"diskfullat{run_copy}:therundidnotstart" in flat(err)
    assert snapshot(run_copy) == before  # no resumes.jsonl, config.toml as it was, no temporary file


# --- 6. the export is staged and renamed -------------------------------------------------------------------------------
def test_a_kill_inside_a_re_export_leaves_the_old_export_or_the_new_one(exported, tmp_path):
    """kill -9 with the new export complete in its staging folder, then between moving the old export aside and
    renaming the new one in: `export/` (or, between the renames, `.old-export`, put back at the next start) is
    the old export byte for byte; the next run's export replaces it whole. The old code rewrote `export/` in
    place, so a kill left the new config beside the old weights."""
    old = snapshot(exported / "export")
    kill9(paused(args(exported, 6, EXPORT), "export_staged", tmp_path))
    assert snapshot(exported / "export") == old
    (first,) = exported.glob(".export-staging-*")
    kill9(paused(args(exported, 6, EXPORT), "export_swap", tmp_path))
    assert not (exported / "export").exists() and snapshot(exported / ".old-export") == old
    assert not first.exists()  # removed at the second start
    kill9(paused(args(exported, 8, EXPORT), "step_7", tmp_path))  # a start: the old export is put back
    assert snapshot(exported / "export") == old and not (exported / ".old-export").exists()
    proc = start(args(exported, 8, EXPORT))
    assert proc.wait(timeout=600) == 0, proc.communicate()[1].decode()[-3000:]
    new = snapshot(exported / "export")
    assert new.keys() == old.keys() and new != old
    assert [p.name for p in exported.iterdir() if p.name.startswith(".") and p.name != ".lock"] == []


# --- 7. no run file follows a planted link ------------------------------------------------------------------------------
def test_a_planted_symlink_is_never_followed(tmp_path, cli):
    """`ln -s VICTIM OUT/.lock` made the run truncate VICTIM (the lock was opened through the link); config.toml,
    metrics.jsonl, resumes.jsonl and metrics.png were written the same way. Now the lock link is refused with exit
    2 and the others are replaced, never written through."""
    run = tmp_path / "run"
    run.mkdir()
    victims = {}
    for name in (".lock", "config.toml", "metrics.jsonl", "metrics.png"):
        victim = tmp_path / f"victim-{name.strip('.')}"
        victim.write_text(f"precious {name}\n")
        (run / name).symlink_to(victim)
        victims[victim] = victim.read_bytes()
    code, _, err = cli(*args(run, 2))
    assert code == 2 and "Traceback" not in err, err
    assert f"{run}/.lockisasymboliclink(to{tmp_path}/victim-lock)" in flat(err)
    (run / ".lock").unlink()
    code, _, err = cli(*args(run, 2))
    assert code == 0, err
    assert {v: v.read_bytes() for v in victims} == victims
    for name in ("config.toml", "metrics.jsonl", "metrics.png"):
        assert not (run / name).is_symlink() and (run / name).stat().st_size > 0
    (run / "resumes.jsonl").symlink_to(tmp_path / "victim-lock")
    code, _, err = cli(*args(run, 4))
    assert code == 0, err
    assert {v: v.read_bytes() for v in victims} == victims
    assert json.loads((run / "resumes.jsonl").read_text())["step"] == 2


# --- 9. a kill inside rotation --------------------------------------------------------------------------------------------
def test_a_kill_inside_rotation_leaves_nothing_the_next_start_does_not_remove(run_copy, tmp_path, cli):
    """max_keep = 1: rotation deletes step 4 after step 6 is in place; kill -9 with its meta.json gone and the
    rest not yet. The old code left that step folder for good (no meta.json: neither rotation nor start-up saw
    it); a folder left so by an older sanarl is removed at start too."""
    kill9(paused(args(run_copy, 6, "train.ckpt.max_keep=1"), "rotation_delete", tmp_path))
    ckpts = run_copy / "checkpoints"
    leftover = [p.name for p in ckpts.iterdir() if p.name.startswith(".retiring-")]
    assert leftover and all(not (ckpts / name / "meta.json").exists() for name in leftover)
    assert leftover == [f".retiring-{STEP(2)}"] and steps_of(run_copy) == [4, 6]
    old_leftover = ckpts / STEP(4)  # an older sanarl's cut-short deletion: meta.json gone first
    (old_leftover / "meta.json").unlink()
    code, out, err = cli(*args(run_copy, 8, "train.ckpt.max_keep=1"))
    assert code == 0, err
    text = flat(out + err)
    assert f"removed{ckpts}/{leftover[0]}(adeletioncutshortbyakill)" in text
    assert f"removed{old_leftover}:ithasnometa.json" in text
    assert sorted(p.name for p in ckpts.iterdir()) == [STEP(8)]


# --- 10. damage that passed without a notice --------------------------------------------------------------------------------
def _drop_meta_key(key: str, name: str | None = None):
    def damage(path: Path) -> None:
        meta = json.loads((path / "meta.json").read_text())
        if name is None:
            meta.pop(key)
        else:
            meta[key].pop(name)
        (path / "meta.json").write_text(json.dumps(meta))

    return damage


@pytest.mark.parametrize(
    ("damage", "expect"),
    [
        (lambda p: (p / "meta.json").unlink(), f"checkpoint{STEP(4)}hasnometa.json(damagedordeleted)"),
        (_drop_meta_key("files"), "meta.jsonhaslostits`files`list"),
        (_drop_meta_key("files", "model.safetensors"), "model.safetensorshasnochecksuminmeta.json"),
    ],
    ids=["meta_deleted", "files_list_dropped", "files_entry_dropped"],
)
def test_damage_to_the_newest_meta_json_falls_back_with_a_notice(run_copy, cli, damage, expect):
    """64 flipped bytes in model.safetensors besides: a meta.json without its checksums used to resume them at
    exit 0; a newest checkpoint without meta.json was skipped silently."""
    newest = run_copy / "checkpoints" / STEP(4)
    damage(newest)
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(
        b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 64]
    )
    (newest / "model.safetensors").write_bytes(bytes(data))
    code, out, err = cli(*args(run_copy, 3))
    assert code == 0, err
    text = flat(out + err)
    assert expect in text
    assert f"resumedfrom{run_copy}/checkpoints/{STEP(2)}atstep2" in text
    assert steps_of(run_copy) == [2, 3]
    (retired,) = (run_copy / "checkpoints" / "retired").iterdir()
    assert retired.name.startswith("damaged-") and (retired / STEP(4)).is_dir()


def test_a_checkpoint_without_checksums_resumes_with_a_notice(run_copy, cli):
    """A checkpoint of an older sanarl (no `format`, no `files` in meta.json) still resumes, with a notice that
    its checksums cannot be verified."""
    _drop_meta_key("files")(run_copy / "checkpoints" / STEP(4))
    _drop_meta_key("format")(run_copy / "checkpoints" / STEP(4))
    code, out, err = cli(*args(run_copy, 5))
    assert code == 0, err
    text = flat(out + err)
    assert f"checkpoint{STEP(4)}recordsnochecksums(writtenbyanoldersanarl)" in text
    assert f"resumedfrom{run_copy}/checkpoints/{STEP(4)}atstep4" in text


# --- 8. secrets never written in the clear -------------------------------------------------------------------------
SECRET = "sk-live-7f3a9c1e5b2d8f4a6c0e"


class JudgeEndpoint:
    """A local OpenAI-compatible /v1/chat/completions that answers "Final Score: 4" to requests bearing SECRET
    (401 otherwise) and counts them."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        endpoint = self
        self.authorized = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Authorization") != f"Bearer {SECRET}":
                    self.send_error(401)
                    return
                endpoint.authorized += 1
                data = json.dumps({"choices": [{"message": {"content": "Final Score: 4"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> JudgeEndpoint:
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _nft_with_judge(run: Path, key_option: str) -> list[str]:
    reward = f"[{{name='unified_reward', weight=1.0, options={{endpoint_url='{{url}}', {key_option}}}}}]"
    sets = [
        f"train.output_dir={run}",
        "train.max_num_steps=2",
        "train.train_batch_per_replica=16",
        "train.train_policy.mini_batch=16",
        "rollout.batch_size=16",
        "policy.diffusers.sample.num_steps=2",
        "train.ckpt.save_freq=1",
        "train.ckpt.export_safetensors=true",
        "validation.enable=false",
        f"train.train_policy.remote_reward.reward_fns={reward}",
    ]
    return ["--config", "tiny-shapes-nft", "sanarl.datasets.shapes", *[x for s in sets for x in ("--set", s)]]


def test_a_reward_endpoint_key_is_never_written_in_the_clear(tmp_path, cli, monkeypatch):
    """The old code wrote `endpoint_api_key` into config.toml, every checkpoint's meta.json and the tracker's
    config. Every file the run writes is read for the key; the tracker's config is caught as it is handed over. A
    rerun from the run's config.toml (key masked) is refused with exit 2 naming the fix; with the key in an
    environment variable (`endpoint_api_key_env`) it runs, and the endpoint saw the key."""
    import sanarl.training.tracking as tracking

    handed: list[dict] = []
    real_init = tracking.MetricsLogger.__init__

    def spy(self, *a, **kw):
        handed.append(kw["config"])
        real_init(self, *a, **kw)

    monkeypatch.setattr(tracking.MetricsLogger, "__init__", spy)
    run = tmp_path / "run"
    with JudgeEndpoint() as judge:
        argv = [a.replace("{url}", judge.url) for a in _nft_with_judge(run, f"endpoint_api_key='{SECRET}'")]
        code, _, err = cli(*argv)
        assert code == 0, err
        assert judge.authorized > 0
        written = [p for p in run.rglob("*") if p.is_file()]
        assert {"config.toml", "meta.json", "metrics.jsonl"} <= {p.name for p in written}
        assert [p for p in written if SECRET.encode() in p.read_bytes()] == []
        assert handed and SECRET not in json.dumps(handed)
        assert 'endpoint_api_key = "<masked>"' in (run / "config.toml").read_text()
        rerun = ["--config", str(run / "config.toml"), "sanarl.datasets.shapes"]
        code, _, err = cli(*rerun, "--set", "train.max_num_steps=3")
        assert code == 2 and "Traceback" not in err, err
        assert "endpoint_api_keyis'<masked>'" in flat(err) and "endpoint_api_key_env" in err
        monkeypatch.setenv("JUDGE_KEY", SECRET)
        before = judge.authorized
        other = tmp_path / "env-run"
        argv = [
            a.replace("{url}", judge.url) for a in _nft_with_judge(other, "endpoint_api_key_env='JUDGE_KEY'")
        ]
        code, _, err = cli(*argv)
        assert code == 0, err
        assert judge.authorized > before
        assert [p for p in other.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()] == []


# --- 11. SIGINT during the export, deep TOML, byte-identical LoRA exports --------------------------------------------------
SIGINT_IN_EXPORT = """
import os, signal, sys
import sanarl.training.runner as runner
real = runner.write_export
def write_export(run_dir, write):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the export starts
    return real(run_dir, write)
runner.write_export = write_export
from sanarl.cli import main
sys.argv = ["sanarl", *sys.argv[1:]]
main()
"""


def test_a_sigint_during_the_export_exits_130_with_the_export_whole(run_copy):
    """The old code swallowed it: exit 0."""
    argv = args(run_copy, 5, EXPORT)
    proc = subprocess.run(
        [sys.executable, "-c", SIGINT_IN_EXPORT, *argv],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "300"},
    )
    text = flat(proc.stderr.decode())
    assert proc.returncode == 130, text[-3000:]
    assert "SIGINTduringtheendoftherun:thefinalcheckpointofstep5andtheexportwerecompletedfirst" in text
    assert steps_of(run_copy) == [2, 4, 5]
    assert any(p.suffix == ".safetensors" for p in (run_copy / "export").rglob("*"))
    assert [p.name for p in run_copy.iterdir() if p.name.startswith(".") and p.name != ".lock"] == []


@pytest.mark.parametrize("where", ["file", "set"])
def test_toml_nested_a_thousand_levels_deep_is_exit_2(cli, tmp_path, where):
    """The old code ended in a RecursionError traceback."""
    deep = "[" * 1200 + "]" * 1200
    if where == "file":
        preset = tmp_path / "deep.toml"
        preset.write_text(f"[train]\nseed = {deep}\n")
        code, _, err = cli("validate", "--config", str(preset), "sanarl.datasets.shapes")
        expect = f"configfile`{preset}`nestsarraysortablestoodeeply"
    else:
        code, _, err = cli(
            "validate",
            "--config",
            "tiny-shapes-sft",
            "sanarl.datasets.shapes",
            "--set",
            f"train.optm_betas={deep}",
        )
        expect = "a`--set`valuenestsarraysortablestoodeeply"
    assert code == 2 and "Traceback" not in err, err
    assert expect in flat(err)


def test_identical_lora_runs_export_identical_files(tmp_path):
    """PEFT keeps the adapter's target_modules as a set, whose order follows the string hash seed of the process,
    and the safetensors writer keeps the file's metadata in a hash map of its own: two identical runs wrote
    different bytes. Two runs under different hash seeds now give byte-identical exports, the metadata entries and
    the target modules written in sorted order."""
    exports = []
    for seed in ("1", "2"):
        run = tmp_path / f"run{seed}"
        argv = args(
            run,
            1,
            EXPORT,
            "policy.lora={r=2, lora_alpha=2.0, target_modules=['to_q','to_k','to_v','to_out.0']}",
            "train.ema_enable=false",
        )
        proc = subprocess.run(
            [sys.executable, "-m", "sanarl", *argv],
            capture_output=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        exports.append(snapshot(run / "export"))
    assert exports[0] == exports[1]
    (lora,) = (tmp_path / "run1" / "export").glob("*.safetensors")
    raw = lora.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])  # in the file's order
    metadata = header["__metadata__"]
    assert list(metadata) == sorted(metadata)
    adapter = json.loads(metadata["lora_adapter_metadata"])
    assert adapter["transformer.target_modules"] == ["to_k", "to_out.0", "to_q", "to_v"]
