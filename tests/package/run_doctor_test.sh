#!/usr/bin/env bash
# `make run` (scripts/run) runs `agentbox doctor` when the daemon fails to start: a data dir that
# cannot be made (in /proc) stops agentboxd with exit 1, and the doctor, given the same data dir,
# names it with its fix. Usage: run_doctor_test.sh REPO BUILD_DIR
set -uo pipefail
repo=$1
build=$2
out=$("$repo/scripts/run" "$build/bin/agentboxd" --listen 127.0.0.1:0 --backend host \
      --data-dir /proc/agentbox-run-test/data 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 1 ]] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
grep -q "agentboxd did not start (exit 1)" <<<"$out" || { echo "FAIL: no notice"; exit 1; }
grep -q "^agentbox doctor:" <<<"$out" || { echo "FAIL: the doctor did not run"; exit 1; }
grep -q "FAIL  data dir: /proc/agentbox-run-test/data" <<<"$out" ||
  { echo "FAIL: the doctor did not check the same data dir"; exit 1; }
grep -q "default backend 'host'" <<<"$out" || { echo "FAIL: the doctor's backend"; exit 1; }
echo PASS
