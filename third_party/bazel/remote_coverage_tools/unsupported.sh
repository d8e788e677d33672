#!/bin/sh
echo "bazel coverage is not supported by psrt's offline Bazel setup" >&2
exit 1
