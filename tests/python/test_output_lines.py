"""A job's output in whole lines: several training processes print many
lines at once (Python's print, lines of many sizes, on stdout and stderr),
and every line reaches psrt-run's output whole, in order per process, none
lost at the job's end; --tag-output starts each with its rank."""

import os
import re
import subprocess
import sys

from jobs import BIN

PS = '{"parameter_server": {"enabled": true, "heartbeat_timeout_s": 5}}'
LINES = 300
# Each process prints LINES lines, of sizes up to 9 KB (more than a pipe's
# atomic write), without flushing, then one last line without a newline.
PRINTER = r"""
import os, sys
rank = os.environ["PSRT_RANK"]
for i in range(%d):
    print("SIDE rank %%s i=%%d value=%%s" %% (rank, i, "x" * (i * 31 %% 9000)))
    if i %% 50 == 0:
        print("ERR rank %%s i=%%d" %% (rank, i), file=sys.stderr)
sys.stdout.write("END rank %%s" %% rank)
""" % LINES


def run(args, tmp_path):
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    p = subprocess.run([os.path.join(BIN, "psrt-run"), "--distribution=" + PS] + args +
                       ["--", sys.executable, str(script)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout, p.stderr


def check(out, err, ranks, tag):
    prefix = (lambda r, stream: "[%d]<%s>:" % (r, stream)) if tag else (lambda r, stream: "")
    lines = out.split("\n")
    assert lines[-1] == "", "the output ends with a whole line"
    for r in range(ranks):
        mine = [line for line in lines if line.startswith(prefix(r, "stdout") + "SIDE rank %d " % r)]
        assert len(mine) == LINES, "rank %d: %d of %d lines" % (r, len(mine), LINES)
        for i, line in enumerate(mine):
            assert line == prefix(r, "stdout") + "SIDE rank %d i=%d value=%s" % (r, i, "x" * (i * 31 % 9000)), \
                "rank %d line %d is not whole: %r" % (r, i, line[:200])
        assert lines.count(prefix(r, "stdout") + "END rank %d" % r) == 1, "rank %d's last line" % r
        errors = [line for line in err.split("\n") if line.startswith(prefix(r, "stderr") + "ERR rank %d " % r)]
        assert errors == [prefix(r, "stderr") + "ERR rank %d i=%d" % (r, i) for i in range(0, LINES, 50)], errors
    # Nothing but the job's lines, each of them whole, on stdout.
    pattern = re.compile(r"^(\[\d+\]<stdout>:)?(SIDE rank \d+ i=\d+ value=x*|END rank \d+)$")
    bad = [line[:200] for line in lines[:-1] if not pattern.match(line)]
    assert not bad, bad


def test_workers_of_one_host_print_whole_lines(tmp_path):
    out, err = run(["--workers=4"], tmp_path)
    check(out, err, 4, tag=False)


def test_hosts_on_one_machine_print_whole_tagged_lines(tmp_path):
    out, err = run(["--local=2", "--workers=2", "--tag-output"], tmp_path)
    check(out, err, 4, tag=True)
