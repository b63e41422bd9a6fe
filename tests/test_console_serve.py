"""The console launcher (agentobs.console.serve): Streamlit's own CLI, with the console's modules imported first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from agentobs.cli.console import run_child
from agentobs.console import APP, command


def test_command_runs_streamlit_through_the_launcher_on_loopback():
    cmd = command(port=1234)
    assert cmd[1:5] == ["-m", "agentobs.console.serve", "run", str(APP)]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == "1234"


def test_preload_imports_every_listed_module_in_a_fresh_process():
    # a fresh interpreter: none of PRELOAD is imported before, all of it after, and nothing failed
    code = ("import sys; from agentobs.console import serve; "
            "before = sorted(m for m in serve.PRELOAD if m in sys.modules); failed = serve.preload(); "
            "print(failed); print(sorted(set(serve.PRELOAD) - set(sys.modules))); print('pandas' in before); "
            "from streamlit import delta_generator as d; print(d._use_warning_has_been_displayed)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # and Streamlit's once-per-process "run it with `streamlit run`" check (an inspect.stack() of the first
    # page, ~0.18 s) is settled: the launcher is `streamlit run`
    assert out.stdout.splitlines() == ["[]", "[]", "False", "True"]


def test_the_launcher_hands_its_arguments_to_streamlit():
    out = subprocess.run([sys.executable, "-m", "agentobs.console.serve", "version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Streamlit, version ")
    # the preload's imports do not print Streamlit's "no runtime yet" cache warnings at every start
    assert "No runtime found" not in out.stderr, out.stderr


def _child(code: str) -> subprocess.Popen:
    """A stand-in for the Streamlit child: a Python process running ``code`` once it has said it is up."""
    return subprocess.Popen([sys.executable, "-c", f"import signal, sys, time; {code}"], stdout=subprocess.PIPE)


def _sigterm_us_once_handled() -> threading.Thread:
    """SIGTERM to this process as soon as run_child's handler is in place (never before: it would end pytest)."""
    before = signal.getsignal(signal.SIGTERM)

    def send():
        while signal.getsignal(signal.SIGTERM) is before:
            threading.Event().wait(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(("code", "grace_s", "child_status"), [
    # a child that stops on SIGTERM ends of that signal, reaped (the handler that waited inside the interrupted
    # wait could not reap it and SIGKILLed it when its 10 s were up: -9)
    ("print('up', flush=True); time.sleep(120)", 10.0, -signal.SIGTERM),
    # one that ignores SIGTERM is killed after the grace period
    ("signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)", 0.5, -signal.SIGKILL),
])
def test_console_passes_a_stop_signal_to_its_child(code, grace_s, child_status):
    before = signal.getsignal(signal.SIGTERM)
    proc = _child(code)
    try:
        assert proc.stdout.readline() == b"up\n"
        sender = _sigterm_us_once_handled()
        assert run_child(proc, grace_s=grace_s) == 128 + signal.SIGTERM
        sender.join(5)
        assert proc.returncode == child_status
        assert signal.getsignal(signal.SIGTERM) is before  # our handlers are put back
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_console_exits_with_its_childs_status():
    proc = _child("print('up', flush=True); sys.exit(3)")
    assert run_child(proc) == 3 and proc.returncode == 3
    proc.stdout.close()
