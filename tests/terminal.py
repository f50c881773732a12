"""Running the CLI as a person does: on a pseudo-terminal (:mod:`pty`), whose line discipline turns a typed Ctrl-C
(``\\x03``) into ``SIGINT`` for the terminal's foreground process group, exactly as an interactive shell's job gets
it. :func:`in_terminal` returns the console's lines (ANSI colour codes removed, a progress bar's redraws dropped:
the lines that stay on the screen) and the exit status."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
#: a rich progress bar's line (``training steps 0 -> 4 ━━━━ 1/4 0:00:04 -:--:--``)
BAR = re.compile(r"━|\d+/\d+ \d+:\d\d:\d\d")


@dataclass
class Console:
    """What a terminal showed: ``lines`` (those that stay), ``raw`` (everything written, ANSI codes removed),
    ``rc`` (exit status: ``-N`` never: a signal's death reads ``128 + N`` as a shell reports it), ``after`` (the
    lines written after the signal was sent)."""

    raw: str
    rc: int
    lines: List[str] = field(default_factory=list)
    after: List[str] = field(default_factory=list)
    signalled_at: Optional[float] = None  #: seconds from start to the signal
    ended_at: float = 0.0  #: seconds from start to the exit


def screen_lines(text: str) -> List[str]:
    """The lines of ``text`` that stay on a screen: split at ``\\r`` and ``\\n``, blank ones, progress bars and
    the terminal's own echo of a typed Ctrl-C (``^C``) dropped."""
    return [s.rstrip() for s in re.split(r"[\r\n]+", ANSI.sub("", text).replace("^C", ""))
            if s.strip() and not BAR.search(s)]


def in_terminal(args: List[str], env: Dict[str, str], signal_when: Optional[str] = None, sig: str = "ctrl-c",
                timeout: float = 900, cwd: Path = ROOT) -> Console:
    """Run ``python -m pretrain_exp *args`` on a pseudo-terminal with ``env`` added to this environment, in ``cwd``
    (the checkout, which is also put on ``PYTHONPATH``).

    :param signal_when: a regular expression; once the console shows it, send ``sig``: ``"ctrl-c"`` types Ctrl-C
        on the terminal (``SIGINT`` to the foreground process group), ``"ctrl-c-twice"`` types it twice, ``"term"``
        sends ``SIGTERM`` to the command's process alone (as ``kill`` does).
    :raises TimeoutError: if the command runs longer than ``timeout`` seconds (it is killed).
    """
    full_env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")} | env
    t0 = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own, the terminal its controlling one
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "pretrain_exp", *args], full_env)
        finally:
            os._exit(127)
    buf, pattern = b"", re.compile(signal_when) if signal_when else None
    sent_at, cut = None, 0
    try:
        while True:
            if time.monotonic() - t0 > timeout:
                os.killpg(pid, signal.SIGKILL)
                raise TimeoutError(f"python -m pretrain_exp {' '.join(args)} ran past {timeout} s")
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                data = b""
            if not data:
                break
            buf += data
            if pattern is not None and sent_at is None and pattern.search(ANSI.sub("", buf.decode("utf-8", "replace"))):
                sent_at, cut = time.monotonic() - t0, len(buf)
                if sig == "term":
                    os.kill(pid, signal.SIGTERM)
                else:
                    os.write(fd, b"\x03")
                    if sig == "ctrl-c-twice":
                        time.sleep(0.5)
                        os.write(fd, b"\x03")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    rc = os.waitstatus_to_exitcode(status)
    text = buf.decode("utf-8", "replace")
    rest = buf[cut:]
    if cut and buf[cut - 1:cut] not in (b"\n", b"\r"):  # the rest of the line that was showing
        rest = rest.split(b"\n", 1)[1] if b"\n" in rest else b""
    after = screen_lines(rest.decode("utf-8", "replace")) if sent_at is not None else []
    return Console(ANSI.sub("", text), 128 - rc if rc < 0 else rc, screen_lines(text), after, sent_at,
                   time.monotonic() - t0)
