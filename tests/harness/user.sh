#!/usr/bin/env bash
# Creates the unprivileged account that Gantry's integration tests submit Slurm jobs as: user and
# group "gantry-test", fixed uid/gid 4242, home /home/gantry-test, shell /bin/bash. Idempotent: an
# existing account with the same name and uid is left alone; a clash (name with another uid, or the uid
# taken by another name) is reported instead of being "fixed". Prints the user name on stdout.
#   GANTRY_TEST_USER (default gantry-test), GANTRY_TEST_UID (default 4242) override the defaults.
set -euo pipefail

user=${GANTRY_TEST_USER:-gantry-test}
uid=${GANTRY_TEST_UID:-4242}

die() {
  echo "gantry-harness: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "user.sh must run as root (it creates the test user $user)"
for cmd in useradd groupadd getent; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd not found (Debian package passwd); run scripts/install-deps"
done

# One run at a time: CTest runs harness scripts of two lanes at once (tests/CMakeLists.txt), and a
# second useradd fails while the first holds /etc/passwd's lock.
exec 9>/run/lock/gantry-harness-user.lock
flock 9

# The group first: useradd -g needs it, and a gid clash is as fatal as a uid clash.
if getent group "$user" >/dev/null; then
  have_gid=$(getent group "$user" | cut -d: -f3)
  [ "$have_gid" = "$uid" ] || die "group $user exists with gid $have_gid, expected $uid; remove it or set GANTRY_TEST_UID=$have_gid"
else
  if other=$(getent group "$uid"); then
    die "gid $uid is taken by group ${other%%:*}; set GANTRY_TEST_UID to a free id"
  fi
  groupadd --gid "$uid" "$user"
fi

if getent passwd "$user" >/dev/null; then
  have_uid=$(id -u "$user")
  [ "$have_uid" = "$uid" ] || die "user $user exists with uid $have_uid, expected $uid; remove it or set GANTRY_TEST_UID=$have_uid"
else
  if other=$(getent passwd "$uid"); then
    die "uid $uid is taken by user ${other%%:*}; set GANTRY_TEST_UID to a free id"
  fi
  useradd --uid "$uid" --gid "$uid" --home-dir "/home/$user" --create-home --shell /bin/bash \
    --comment "Gantry integration tests" "$user"
fi

# A home the user owns: srun falls back to it, and later tests put credentials there.
home=$(getent passwd "$user" | cut -d: -f6)
if [ ! -d "$home" ]; then
  mkdir -p "$home"
  chown "$uid:$uid" "$home"
  chmod 0755 "$home"
fi
echo "$user"
