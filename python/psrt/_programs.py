"""Where psrt's programs are, for every launcher in this package."""

import os
import sys
import sysconfig


def find_programs(names, bin_dir=None, environ=None):
    """The absolute directory that holds every program in `names`.

    It is `bin_dir` if given, else $PSRT_BIN_DIR; either one must hold them.
    Otherwise it is the first of: the scripts directory that psrt's wheel
    installs its programs to (CMakeLists.txt: RUNTIME DESTINATION
    SKBUILD_SCRIPTS_DIR), the interpreter's own directory, and PATH. Raises
    FileNotFoundError naming what is missing and where it looked."""
    environ = os.environ if environ is None else environ
    chosen = bin_dir or environ.get("PSRT_BIN_DIR")
    if chosen:
        dirs = [chosen]
        looked = "%s (%s)" % (chosen, "bin_dir" if bin_dir else "PSRT_BIN_DIR")
    else:
        dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
        dirs += environ.get("PATH", os.defpath).split(os.pathsep)
        looked = "%s, %s or PATH (PSRT_BIN_DIR is unset)" % tuple(dirs[:2])
    for d in dirs:
        if d and all(os.access(os.path.join(d, name), os.X_OK) for name in names):
            return os.path.abspath(d)
    raise FileNotFoundError("%s not found in %s; install psrt (pip install psrt) or set PSRT_BIN_DIR"
                            % (" and ".join(names), looked))
