"""capture.monitor: real compiles vs file-cache hits, autotune benchmarks, helper builds, and
capture from child processes, all with real Triton (AOT compiles for sm_90 on CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import aot
import pytest
import servekit
import triton

from cachebake.capture import monitor
from cachebake.capture.env import bake_env
from cachebake.capture.events import EventSummary, read_events

REPO = Path(__file__).resolve().parent.parent
TESTS = servekit.kernels_dir()  # where every process of the session imports the test kernels


@pytest.fixture(autouse=True)
def _no_cache_dir_leak():
    """aot_compile points Triton's cache knob (and so os.environ) at a tmp dir: undo that."""
    saved = os.environ.get("TRITON_CACHE_DIR")
    yield
    triton.knobs.cache.__dict__.pop("dir", None)
    if saved is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = saved


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "events.jsonl"
    assert monitor.activate(path)
    yield path
    monitor.deactivate()


def test_compile_then_hit_in_process(log, tmp_path):
    cache = tmp_path / "cache"
    with monitor.step("prefill-100"):
        aot.aot_compile(cache)
    aot.aot_compile(cache)  # same key: a file-cache hit
    aot.aot_compile(cache, constexprs={"BLOCK": 64}, options={"num_warps": 8})
    events = read_events(log)
    assert [e.kind for e in events] == ["compile", "cache_hit", "compile"]
    first, hit, other = events
    assert first.kernel == "add_kernel" and first.step == "prefill-100"
    assert hit.step is None
    assert (cache / first.key / "add_kernel.cubin").is_file()
    assert hit.key == first.key and other.key != first.key
    assert first.constexprs == {"BLOCK": 128} and other.constexprs == {"BLOCK": 64}
    assert first.signature["x_ptr"] == "*fp32"
    assert first.options["num_warps"] == 4 and other.options["num_warps"] == 8
    assert first.target == "cuda:90"
    assert first.pid == os.getpid() and first.seconds > 0
    s = EventSummary.of(events)
    assert (s.compiles, s.cache_hits, s.kernels, s.stable) == (2, 1, ["add_kernel"], False)


def test_an_infinite_constexpr_is_logged_as_strict_json(log, tmp_path):
    """vLLM's _chunk_cumsum_fwd_kernel takes dt_max=inf: the event says "inf", and every line
    of the log is JSON a strict reader (install's) accepts."""
    from cachebake.jsonio import parse_json

    aot.aot_compile(tmp_path / "cache", aot.clamp_kernel)
    (event,) = read_events(log)
    assert event.kind == "compile" and event.constexprs == {"LIMIT": "inf", "BLOCK": 128}
    for line in log.read_bytes().splitlines():
        parse_json(line, "events")


def test_deactivated_monitor_logs_nothing(tmp_path):
    path = tmp_path / "events.jsonl"
    monitor.activate(path)
    monitor.deactivate()
    aot.aot_compile(tmp_path / "cache", aot.scale_kernel)
    assert read_events(path) == []


def test_helper_build_is_seen_through_the_cache_manager(log, tmp_path):
    # Triton's runtime.build puts the gcc-built launcher through the cache manager like this.
    triton.knobs.cache.dir = str(tmp_path / "cache")
    from triton.runtime.cache import get_cache_manager

    manager = get_cache_manager("ab" * 32)
    manager.put(b"\x7fELF...", "__triton_launcher.cpython-311-x86_64-linux-gnu.so", binary=True)
    (event,) = read_events(log)
    assert event.kind == "helper_build" and event.kernel == "__triton_launcher"
    assert event.key == manager.key


def test_autotune_benchmark_is_seen_and_disk_hit_is_not(log, tmp_path, monkeypatch):
    """A real Autotuner with cache_results; only the GPU parts (timing a config, launching)
    are replaced, since this machine has none."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import autotuner as autotuner_mod

    class FakeDriver:
        class active:
            @staticmethod
            def get_current_target():
                return GPUTarget("cuda", 90, 32)

    monkeypatch.setattr(autotuner_mod, "driver", FakeDriver)
    monkeypatch.setattr(autotuner_mod.Autotuner, "_bench",
                        lambda self, *a, config, **k: [float(config.kwargs["BLOCK"])] * 3)
    triton.knobs.cache.dir = str(tmp_path / "cache")

    def make_tuner():
        tuner = triton.autotune(
            configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
            key=["n"], cache_results=True)(aot.add_kernel)
        tuner.fn = _NoLaunch(tuner.fn)
        return tuner

    tuner = make_tuner()
    tuner.run(None, None, None, 1000, grid=(1,))
    tuner.run(None, None, None, 1000, grid=(1,))  # in-memory hit: no benchmark
    (event,) = read_events(log)
    assert event.kind == "autotune" and event.kernel == "add_kernel"
    assert event.detail["configs"] == 2 and event.detail["stored"] is True
    assert event.detail["tuning_key"] == ["1000"]
    assert "BLOCK: 64" in event.detail["best"]
    assert (tmp_path / "cache" / event.key / "add_kernel.autotune.json").is_file()

    make_tuner().run(None, None, None, 1000, grid=(1,))  # fresh tuner: disk hit
    make_tuner().run(None, None, None, 2000, grid=(1,))  # new tuning key: benchmarks
    kinds = [(e.kind, e.detail.get("tuning_key")) for e in read_events(log)]
    assert kinds == [("autotune", ["1000"]), ("autotune", ["2000"])]


class _NoLaunch:
    """Stands in for the launch of the chosen config (no GPU here)."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, *args, **kwargs):
        return None


def _child(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True,
                          text=True, timeout=120)


CHILD_COMPILE = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import aot
aot.aot_compile(None)
aot.aot_compile(None, aot.scale_kernel)
"""


def test_capture_from_a_child_process_via_sitecustomize(tmp_path):
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "ev.jsonl")
    env = {**benv.env, "CACHEBAKE_STEP": "warmup"}
    for _ in range(2):
        r = _child(CHILD_COMPILE, env)
        assert r.returncode == 0, r.stderr
    events = read_events(tmp_path / "ev.jsonl")
    assert [(e.kind, e.kernel) for e in events] == [
        ("compile", "add_kernel"), ("compile", "scale_kernel"),
        ("cache_hit", "add_kernel"), ("cache_hit", "scale_kernel")]
    assert len({e.pid for e in events}) == 2 and os.getpid() not in {e.pid for e in events}
    assert all(e.step == "warmup" for e in events)
    assert all((tmp_path / "root/triton" / e.key).is_dir() for e in events)


def test_capture_via_import_activate(tmp_path):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO),
           "CACHEBAKE_MONITOR_LOG": str(tmp_path / "ev.jsonl"),
           "TRITON_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    r = _child("import cachebake.capture.activate\n" + CHILD_COMPILE, env)
    assert r.returncode == 0, r.stderr
    assert [e.kind for e in read_events(tmp_path / "ev.jsonl")] == ["compile", "compile"]


def test_sitecustomize_is_inert_without_the_variable(tmp_path):
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "ev.jsonl")
    env = dict(benv.env)
    del env["CACHEBAKE_MONITOR_LOG"]
    r = _child("import sys; print('cachebake' in sys.modules, 'triton' in sys.modules)", env)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr
    # and with it set, a process that never uses Triton does not pay for importing it
    r = _child("import sys; print('cachebake' in sys.modules, 'triton' in sys.modules)",
               benv.env)
    assert r.returncode == 0 and r.stdout.split() == ["True", "False"], r.stderr


def test_vllm_plugin_is_cheap_when_off_and_activates_when_on(tmp_path):
    code = ("import sys; from cachebake.serve.vllm_plugin import register; register(); "
            "from cachebake.capture import monitor; "
            "print('triton' in sys.modules, monitor.is_active())\n"
            "import triton\n"
            "print(getattr(triton.knobs.compilation.listener, '_cachebake', False))")
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    off = _child(code, base)
    assert off.stdout.split() == ["False", "False", "False"], off.stderr
    on = _child(code, {**base, "CACHEBAKE_MONITOR_LOG": str(tmp_path / "ev.jsonl")})
    # armed without importing Triton; the taps go in when the program imports it
    assert on.stdout.split() == ["False", "True", "True"], on.stderr


def test_taps_go_in_when_triton_was_imported_first(tmp_path):
    code = ("import triton\nfrom cachebake.capture import monitor\n"
            f"monitor.activate({str(tmp_path / 'ev.jsonl')!r})\n"
            "print(getattr(triton.knobs.compilation.listener, '_cachebake', False))")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    assert _child(code, env).stdout.split() == ["True"]


def test_many_processes_append_whole_lines(tmp_path):
    path = tmp_path / "ev.jsonl"
    code = ("from cachebake.capture import monitor; from cachebake.capture.events import Event\n"
            f"monitor.activate({str(path)!r})\n"
            "for i in range(300): monitor.emit(Event(kind='cache_hit', kernel='k' * 200, "
            "detail={'i': i, 'pad': 'x' * 3000}))\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 1200
    events = read_events(path)
    assert len(events) == 1200 and len({e.pid for e in events}) == 4


def test_read_events_skips_a_torn_line(tmp_path):
    path = tmp_path / "ev.jsonl"
    path.write_text('{"kind": "compile", "kernel": "a"}\n{"kind": "comp')
    assert [e.kernel for e in read_events(path)] == ["a"]
    assert read_events(tmp_path / "missing.jsonl") == []


def test_a_configured_cache_manager_is_wrapped_not_replaced(tmp_path):
    (tmp_path / "mymanager.py").write_text(
        "from triton.runtime.cache import FileCacheManager\n"
        "class Manager(FileCacheManager):\n"
        "    def put(self, data, filename, binary=True):\n"
        "        open(__file__ + '.puts', 'a').write(filename + '\\n')\n"
        "        return super().put(data, filename, binary)\n")
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "ev.jsonl",
                    base_env={**os.environ, "PYTHONPATH": str(tmp_path),
                              "TRITON_CACHE_MANAGER": "mymanager:Manager"})
    code = CHILD_COMPILE + (
        "from triton.runtime.cache import get_cache_manager\n"
        "get_cache_manager('cd' * 32).put(b'x', 'cuda_utils.so')\n")
    r = _child(code, benv.env)
    assert r.returncode == 0, r.stderr
    puts = (tmp_path / "mymanager.py.puts").read_text().split()
    assert "add_kernel.cubin" in puts and "cuda_utils.so" in puts
    kinds = [e.kind for e in read_events(tmp_path / "ev.jsonl")]
    assert kinds == ["compile", "compile", "helper_build"]


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['MARKER'], 'w').write('ran')\n")
    benv = bake_env(tmp_path / "root", ("triton",), monitor_log=tmp_path / "ev.jsonl",
                    base_env={**os.environ, "PYTHONPATH": str(other)})
    env = {**benv.env, "MARKER": str(tmp_path / "marker")}
    r = _child("from cachebake.capture import monitor; print(monitor.is_active())", env)
    assert r.returncode == 0 and r.stdout.split() == ["True"], r.stderr
    assert (tmp_path / "marker").read_text() == "ran"


def test_event_tail_returns_only_whole_new_lines(tmp_path):
    from cachebake.capture.events import EventTail

    path = tmp_path / "ev.jsonl"
    tail = EventTail(path)
    assert tail.new_events() == []  # no log yet
    path.write_text('{"kind": "compile", "kernel": "a"}\n{"kind": "cache_hit", "ker')
    assert [e.kernel for e in tail.new_events()] == ["a"]
    with open(path, "a") as f:
        f.write('nel": "b"}\n')
    assert [e.kernel for e in tail.new_events()] == ["b"]
    assert tail.new_events() == []


def test_progress_prints_round_summaries_off_a_terminal(tmp_path):
    import io

    from rich.console import Console

    from cachebake.bake.rounds import RoundReport
    from cachebake.capture.events import Event
    from cachebake.cli.progress import RoundProgress

    out = io.StringIO()
    progress = RoundProgress(Console(file=out, force_terminal=False, width=200), verb="bake")
    progress.start_round(1, 4)
    progress.update([Event(kind="compile", kernel="k", seconds=2.0)])
    events = [Event(kind="compile", kernel="k", seconds=2.0), Event(kind="cache_hit", kernel="j")]
    progress.end_round(RoundReport(1, 0, 3.0, EventSummary.of(events), str(tmp_path / "log")))
    assert out.getvalue().strip() == ("bake round 1: compiled -- 1 compiles (2.0 s), 1 hits, "
                                      "0 autotunes (0.0 s), 0 helper builds, 3.0 s")
    # a round without work is quiet, not "stable": stable takes --quiet-rounds of them in a row
    out.truncate(0), out.seek(0)
    progress.start_round(2, 4)
    progress.end_round(RoundReport(2, 0, 1.0, EventSummary.of([Event(kind="cache_hit", kernel="k")]),
                                   str(tmp_path / "log")))
    assert out.getvalue().strip().startswith("bake round 2: quiet -- 0 compiles")


def test_step_set_through_the_environment_is_seen(log, tmp_path, monkeypatch):
    # the kernels driver labels its cases by setting CACHEBAKE_STEP directly
    monkeypatch.setenv("CACHEBAKE_STEP", "decode bs=17")
    aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 32})
    monkeypatch.delenv("CACHEBAKE_STEP")
    with monitor.step("outer"):
        with monitor.step("inner"):
            aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 16})
        aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 16})
    aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 16})
    assert [e.step for e in read_events(log)] == ["decode bs=17", "inner", "outer", None]
    assert "CACHEBAKE_STEP" not in os.environ


def test_a_program_assigning_its_own_listener_is_chained_not_obeyed(log, tmp_path):
    """Programs watch compiles by assigning triton.knobs.compilation.listener; the monitor
    must keep seeing compiles and hits, and the program's listener must still be called."""
    seen = []

    def theirs(*, src, metadata, metadata_group, times, cache_hit):
        seen.append(cache_hit)

    aot.aot_compile(tmp_path / "warm", aot.scale_kernel)  # installs the taps
    triton.knobs.compilation.listener = theirs
    try:
        aot.aot_compile(tmp_path / "cache")
        aot.aot_compile(tmp_path / "cache")
        # ... and a listener that calls "the previous one" (the monitor) back runs us once
        previous = triton.knobs.compilation.listener

        def wrapping(**kw):
            seen.append("wrapped")
            previous(**kw)

        triton.knobs.compilation.listener = wrapping
        aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 64})
        with triton.knobs.compilation.scope():  # Triton's own save/restore keeps the chain
            triton.knobs.compilation.listener = None
            aot.aot_compile(tmp_path / "cache", constexprs={"BLOCK": 32})
        assert triton.knobs.compilation.__dict__.get(monitor._CHAINED) is wrapping
    finally:
        triton.knobs.compilation.listener = None
    kinds = [e.kind for e in read_events(log)]
    assert kinds == ["compile", "compile", "cache_hit", "compile", "compile"]
    assert seen == [False, True, "wrapped"]
    assert triton.knobs.compilation.knob_descriptors  # Triton still sees its env knobs
