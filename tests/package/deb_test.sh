#!/usr/bin/env bash
# The .deb as a user meets it (issue 23): built by CPack from this build, installed with
# `dpkg --root` into an empty temp tree (a debootstrap root would need the Debian archive, and
# tests reach only this machine), its maintainer scripts run chrootless with DPKG_ROOT set.
# Checks: the files and the data dir are where the README says; `systemd-analyze verify`
# accepts both units; the daemon started from agentboxd.service's exact ExecStart line (in a
# private mount + network namespace where the package's /usr, /etc and /var/lib lie over the
# host's) serves /readyz; an upgrade keeps an edited conffile and the data; remove keeps both;
# purge removes the configuration and keeps the data. Leaves nothing behind.
# Usage: deb_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/agentbox-deb-test.XXXXXX)
daemon_pid=
cleanup() {
  if [[ -n $daemon_pid ]]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cpack builds the .deb"
(cd "$build" && cpack -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; fail "cpack"; }
deb=$(ls "$tmp"/out/agentbox_*_*.deb)
[[ $(basename "$deb") =~ ^agentbox_[0-9][^_]*_[a-z0-9]+\.deb$ ]] || fail "file name $(basename "$deb")"
dpkg-deb --info "$deb" >"$tmp/info"
grep -q '^ Depends:.*libc6' "$tmp/info" || { cat "$tmp/info"; fail "no shlibs Depends"; }
# Listed whole before it is searched: `grep -q` leaving at its first match would kill the writer
# with SIGPIPE, which pipefail reports as a failure (it failed one full run of two).
ctrl=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
grep -qx './conffiles' <<<"$ctrl" || fail "no conffiles"

root=$tmp/root
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info" "$root/etc/systemd/system"
touch "$root/var/lib/dpkg/status"
dpkg_root() {
  dpkg --root="$root" --force-script-chrootless --force-depends --force-confold \
    --log=/dev/null "$@"
}

step "dpkg --root installs it"
dpkg_root -i "$deb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i"; }
for f in usr/bin/agentboxd usr/bin/agentbox usr/bin/agentbox-runner usr/bin/agentbox-init \
         lib/systemd/system/agentboxd.service lib/systemd/system/agentbox-runner@.service \
         etc/agentbox/agentboxd.yaml usr/share/man/man8/agentboxd.8.gz \
         usr/share/man/man1/agentbox.1.gz usr/share/man/man1/agentbox-runner.1.gz; do
  [[ -e $root/$f ]] || fail "$f not installed"
done
[[ $(stat -c %a "$root/var/lib/agentbox") == 700 ]] || fail "/var/lib/agentbox is not 0700"
grep -qx /etc/agentbox/agentboxd.yaml "$root/var/lib/dpkg/info/agentbox.conffiles" ||
  fail "agentboxd.yaml is not a conffile"
[[ -L $root/etc/systemd/system/multi-user.target.wants/agentboxd.service ]] ||
  fail "agentboxd.service not enabled by the postinst"
man=$(zcat "$root/usr/share/man/man8/agentboxd.8.gz")
grep -qF 'data\-dir' <<<"$man" ||
  fail "the agentboxd man page lacks --data-dir"

step "systemd-analyze verify accepts the units"
# Relative to the root: ExecStart's binaries must exist there. The root is no whole system, so
# the host's own units (the targets ours are ordered after) are put beside them, and the man
# pages of Documentation= are looked up in the root.
mkdir -p "$root/usr/lib/systemd/system"
cp -a /lib/systemd/system/. "$root/usr/lib/systemd/system/"
for u in agentboxd.service agentbox-runner@alice.service; do
  out=$(MANPATH="$root/usr/share/man" systemd-analyze verify --root="$root" "$u" 2>&1) ||
    { echo "$out"; fail "verify $u"; }
  # verify exits 0 on some warnings; treat any line naming our unit as a failure.
  if grep -E "agentbox" <<<"$out" | grep -v "^$"; then fail "verify $u warned"; fi
done

step "the daemon started from the unit's ExecStart serves /readyz"
exec_start=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/agentboxd.service")
[[ $exec_start == /usr/bin/agentboxd* ]] || fail "ExecStart is '$exec_start'"
cat >"$tmp/run.sh" <<'RUN'
set -euo pipefail
root=$1; exec_start=$2; log=$3
mount --make-rprivate /
ip link set lo up
mount -t overlay overlay -o "lowerdir=$root/usr:/usr" /usr
mount -t overlay overlay -o "lowerdir=$root/etc:/etc" /etc
mount --bind "$root/var/lib" /var/lib
read -r -a argv <<<"$exec_start"
"${argv[@]}" >"$log" 2>&1 &
pid=$!
body=
deadline=$((SECONDS + 90))  # a loaded 2-core machine starts a daemon slowly
while ((SECONDS < deadline)); do
  if body=$(curl -sf --max-time 5 http://127.0.0.1:9090/readyz); then break; fi
  kill -0 "$pid" 2>/dev/null || { echo "agentboxd exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?
[[ -n $body ]] || { echo "no answer from /readyz in 90 s; the daemon's log:"; cat "$log"; exit 1; }
echo "$body"
[[ $rc -eq 0 ]] || { echo "agentboxd exit $rc after SIGTERM"; cat "$log"; exit 1; }
RUN
body=$(unshare --mount --net bash "$tmp/run.sh" "$root" "$exec_start" "$tmp/agentboxd.log") ||
  { echo "$body"; fail "daemon from ExecStart"; }
echo "$body"
grep -q '"ready":true' <<<"$body" || fail "/readyz: $body"
grep -q '"backend":"ns"' <<<"$body" || fail "/readyz backend: $body"
[[ -f $root/var/lib/agentbox/state.db ]] || fail "no state.db in /var/lib/agentbox"

step "an upgrade keeps the edited configuration and the data"
echo "# edited by the admin" >>"$root/etc/agentbox/agentboxd.yaml"
echo keep >"$root/var/lib/agentbox/user-file"
dpkg_root -i "$deb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i (upgrade)"; }
grep -q "edited by the admin" "$root/etc/agentbox/agentboxd.yaml" || fail "upgrade lost the edit"
[[ $(cat "$root/var/lib/agentbox/user-file") == keep ]] || fail "upgrade touched the data"

step "remove keeps configuration and data"
dpkg_root --remove agentbox >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg --remove"; }
[[ ! -e $root/usr/bin/agentboxd ]] || fail "remove left the daemon"
[[ -f $root/etc/agentbox/agentboxd.yaml ]] || fail "remove deleted the configuration"
[[ -f $root/var/lib/agentbox/user-file ]] || fail "remove deleted the data"

step "purge removes the configuration, keeps the data and says so"
dpkg_root --purge agentbox >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg --purge"; }
[[ ! -e $root/etc/agentbox ]] || fail "purge left /etc/agentbox"
[[ ! -e $root/etc/systemd/system/multi-user.target.wants/agentboxd.service ]] ||
  fail "purge left the unit enabled"
[[ -f $root/var/lib/agentbox/user-file ]] || fail "purge deleted the data"
grep -q "/var/lib/agentbox.*kept" "$tmp/dpkg.log" || { cat "$tmp/dpkg.log"; fail "purge said nothing"; }
echo "PASS"
