"""`aspan.applications.launch` without a cluster: the resources from the `[slurm]` table and flags (bad ones refused
in one line naming the key or flag), the flags' rules, the submitit parameters, the merge of shard files, and the
watcher's retry rule against a scripted queue. The real Slurm runs are in tests/cluster."""
import json

import pytest

from aspan.applications import launch
from aspan.applications.launch import SlurmResources, load_resources, merge_rows, sweep_array
from aspan.cli import main
from aspan.errors import UsageError
from aspan.experiments.engine import ROW_FIELDS
from aspan.experiments.sweep import SweepConfig, grid, shard_points
from aspan.io import settings_key


def sweep_toml(tmp_path, ckpt, slurm: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'model = "{ckpt}"\ntask = "reversal"\nsplit = "ood"\ntask_params = {{length = [11, 12]}}\n'
                    'n_samples = 2\nseeds = [0]\nbatch_size = 2\nstrengths = [0.5, 3.0]\ndeltas = [0, 2]\n'
                    f'device = "cpu"\n[heads]\nlist = [[0, 0]]\n{slurm}')
    return str(path)


def row(key: str, **extra) -> dict:
    """A row with every field a sweep row must hold."""
    return {**dict.fromkeys(ROW_FIELDS, 0), "key": key, **extra}


def test_resources_come_from_the_slurm_table_then_the_flags(tmp_path, ckpt):
    toml = sweep_toml(tmp_path, ckpt, '[slurm]\npartition = "gpu"\ntime = 30\nmem = "8G"\nsbatch = {account = "lab"}\n')
    r = load_resources(toml, {"time": 90, "gpus": 1, "sbatch": {"qos": "low"}, "cpus": None})
    assert (r.partition, r.time, r.gpus, r.mem, r.cpus) == ("gpu", 90, 1, "8G", 1)
    assert r.sbatch == {"account": "lab", "qos": "low"}
    params = r.executor_parameters()
    assert params["partition"] == "gpu" and params["time"] == 90 and params["gpus_per_node"] == 1
    assert params["mem"] == "8G" and params["additional_parameters"] == {"account": "lab", "qos": "low"}
    assert "gpus_per_node" not in SlurmResources().executor_parameters()
    # the sweep's own settings ignore the table: the local run reads the same file
    assert SweepConfig.from_toml(toml).strengths == (0.5, 3.0)


@pytest.mark.parametrize("table, flags, message", [
    ('[slurm]\ngpu = 1\n', {}, "[slurm]: unknown key 'gpu'"),
    ('[slurm]\ntime = "1h"\n', {}, "[slurm] time"),
    ('[slurm]\ntime = 0\n', {}, "time must be at least 1"),
    ('', {"max_retries": -1}, "--max-retries: max_retries must be at least 0"),
    ('slurm = 3\n', {}, "slurm must be a table"),
])
def test_bad_resources_are_refused_in_one_line_naming_the_key(tmp_path, ckpt, table, flags, message):
    path = tmp_path / "r.toml"
    path.write_text(table)
    with pytest.raises(UsageError) as e:
        load_resources(path, flags)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, message", [
    (["--partition", "gpu"], "--partition needs --launcher slurm"),
    (["--no-wait"], "--no-wait needs --launcher slurm"),
    (["--launcher", "slurm", "--shard", "0/2"], "--shard and --launcher slurm"),
    (["--launcher", "slurm", "--limit", "1"], "--limit and --launcher slurm"),
    (["--launcher", "slurm", "--sbatch", "account"], "expected KEY=VALUE"),
])
def test_launcher_flags_out_of_place_are_refused_before_any_work(tmp_path, ckpt, capsys, args, message):
    out = tmp_path / "out"
    assert main(["sweep", sweep_toml(tmp_path, ckpt), "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_merge_writes_sweep_jsonl_in_grid_order_once_per_key(tmp_path, ckpt):
    config = SweepConfig.from_toml(sweep_toml(tmp_path, ckpt))
    points = grid(config)
    for i in range(2):  # shard files with rows out of grid order, and one row twice (a task resubmitted)
        rows = [row(settings_key(p), i=i, n=j) for j, p in enumerate(shard_points(points, (i, 2)))]
        (tmp_path / f"sweep.shard-{i}-of-2.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in [*rows[::-1], rows[0]]))
    assert merge_rows(tmp_path, [settings_key(p) for p in points]) == len(points) == 4
    merged = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert [r["key"] for r in merged] == [settings_key(p) for p in points]
    assert not list(tmp_path.glob("sweep.shard-*"))


class Queue:
    """A scripted Slurm: submitted tasks stay queued for `ticks` looks, then leave having written their shard's rows,
    except those whose attempt number is in `fail` (shard -> attempts that die without rows)."""

    def __init__(self, plan, points, fail):
        self.plan, self.points = plan, points
        self.plan, self.fail, self.queued, self.next_id, self.submits, self.looks = plan, fail, {}, 100, [], 0

    def submit(self, plan, shards, *args):
        self.submits.append(list(shards))
        for i in shards:
            plan.attempts[i] = plan.attempts.get(i, 0) + 1
            plan.jobs[i] = str(self.next_id)
            self.queued[str(self.next_id)] = (i, plan.attempts[i], 1)
            self.next_id += 1
        return [plan.jobs[i] for i in shards]

    def look(self):
        self.looks += 1
        assert self.looks < 100, "the watcher never finishes"
        for job, (i, attempt, ticks) in list(self.queued.items()):
            if ticks:
                self.queued[job] = (i, attempt, ticks - 1)
                continue
            del self.queued[job]
            if attempt not in self.fail.get(i, ()):
                keys = [settings_key(p) for p in shard_points(self.points, (i, self.plan.tasks))]
                with (self.plan.out / f"sweep.shard-{i}-of-{self.plan.tasks}.jsonl").open("a") as f:
                    f.writelines(json.dumps(row(k)) + "\n" for k in keys)
        return {job: "RUNNING" for job in self.queued}


def watch(tmp_path, ckpt, monkeypatch, fail, retries):
    config = SweepConfig.from_toml(sweep_toml(tmp_path, ckpt))
    plan = launch._Plan(tmp_path, 2, {}, {})
    queue = Queue(plan, grid(config), fail)
    monkeypatch.setattr(launch, "_submit", queue.submit)
    monkeypatch.setattr(launch, "queued_jobs", queue.look)
    queue.submit(plan, [0, 1])
    launch._watch(plan, sweep_array(config, tmp_path, "c.toml"), SlurmResources(max_retries=retries, poll=0.001),
                  progress=False)
    return plan, queue


def test_a_task_that_dies_is_resubmitted_alone_until_its_shard_completes(tmp_path, ckpt, monkeypatch):
    plan, queue = watch(tmp_path, ckpt, monkeypatch, fail={1: (1, 2)}, retries=2)
    assert queue.submits == [[0, 1], [1], [1]] and plan.attempts == {0: 1, 1: 3}
    assert all((tmp_path / f"sweep.shard-{i}-of-2.jsonl").exists() for i in (0, 1))


def test_a_shard_out_of_retries_stops_the_wait_naming_it(tmp_path, ckpt, monkeypatch):
    with pytest.raises(ChildProcessError, match=r"shard 1/2 of .* failed 2 times: no error output"):
        watch(tmp_path, ckpt, monkeypatch, fail={1: (1, 2)}, retries=1)


def test_a_rerun_keeps_the_shard_count_adopts_the_jobs_and_gives_each_shard_its_retries_anew(tmp_path):
    launch._Plan(tmp_path, 3, {0: "7_0", 1: "8"}, {0: 1, 1: 3}).save()
    array = launch.Array(tmp_path, "sweep", print, (), 5)
    again = launch._plan(array, SlurmResources(array_tasks=9))
    assert (again.tasks, again.jobs, again.attempts) == (3, {0: "7_0", 1: "8"}, {})
    (tmp_path / ".slurm" / "launch.json").write_text('{"tasks": "many"}')
    with pytest.raises(ValueError, match=r"launch.json: tasks must be an integer from 1 to 100000, got .many."):
        launch._plan(array, SlurmResources())
    assert launch._plan(launch.Array(tmp_path / "new", "demo", print, (), 4), SlurmResources()).tasks == 4


def test_the_slurm_how_to_parses(tmp_path):
    """Every command line of docs/howto/slurm.md parses with aspan's own parser (as `--launcher slurm`), and its
    `[slurm]` table loads through the loader a run uses, to the values the page states."""
    import re
    import shlex
    from pathlib import Path

    from aspan.cli import build_parser

    page = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "slurm.md").read_text(encoding="utf-8")
    lines = [line.strip() for block in re.findall(r"```shell\n(.*?)```", page, re.S)
             for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("aspan ")]
    assert {argv[0] for argv in commands} == {"sweep", "demo", "pretrained", "study"}
    for argv in commands:
        args = build_parser(argv).parse_args(argv)
        assert args.launcher == "slurm" or args.list_units or args.unit is not None, argv
    table = re.search(r"```toml\n(.*?)```", page, re.S)[1]
    tmp = tmp_path / "slurm.toml"
    tmp.write_text(table, encoding="utf-8")
    got = load_resources(tmp, {})
    assert (got.partition, got.time, got.gpus, got.array_tasks, got.max_retries) == ("gpu", 120, 1, 8, 2)
    assert dict(got.sbatch) == {"account": "mylab", "qos": "normal"}
