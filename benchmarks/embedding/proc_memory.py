"""What the memory benchmarks (memory.py, checkpoint_memory.py) share: a field of
/proc/self/status, and a measurement run in a child process of its own (a fresh process, so
nothing an earlier measurement allocated is counted)."""
import subprocess
import sys


def status_bytes(field):
    """/proc/self/status's `field` (VmRSS, VmHWM, RssAnon, ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_child(cmd, env, tag):
    """Runs `cmd` and prints the last line of its output that starts with `tag`; returns 0, or,
    when it failed or printed no such line, shows its output's end on stderr and returns its exit
    status (1 if that was 0)."""
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(tag)]
    if out.returncode != 0 or not lines:
        print(out.stdout[-3000:], file=sys.stderr)
        return out.returncode or 1
    print(lines[-1], flush=True)
    return 0
