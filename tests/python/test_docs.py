"""The docs against the programs: every distribution key psrt-run knows is
in the README's table of them (with its sub-keys, as `checkpoint.uri` is in
the `checkpoint` row)."""

import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("PSRT_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def distribution_keys():
    out = subprocess.run([os.path.join(BIN, "psrt-run"), "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    block = out.split("Distribution keys", 1)[1].split("\nFlags:", 1)[0]
    return re.findall(r"^  ([a-z_.]+)\s", block, re.M)


def readme_table():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    table = text.split("### The distribution option", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    return {row.split("|")[1]: row.split("|")[2] for row in table.splitlines() if row.startswith("| `")}


def test_the_readme_lists_every_distribution_key():
    keys = distribution_keys()
    assert "mode" in keys and "checkpoint.uri" in keys, keys
    rows = readme_table()
    named = {k for cell in rows for k in re.findall(r"`([a-z_]+)`", cell)}
    missing = []
    for key in keys:
        if key == "parameter_server":
            continue  # the top-level key the table is inside
        top, _, sub = key.partition(".")
        if top not in named or (sub and not any(sub in text for cell, text in rows.items() if top in cell)):
            missing.append(key)
    assert not missing, "README.md's distribution table lacks %s" % missing
