#!/usr/bin/env bash
# The Debian packages that the heavy test tiers need, installed once, as root, before pytest.
# The tests themselves never install anything: a heavy-tier test that lacks a tool skips
# with the name of this script (or fails, when CI=true).
#
#   bash tests/system-packages.sh            install what is missing (idempotent; ~2-4 min the
#                                            first time on a fresh Debian 12, ~1 s after)
#   bash tests/system-packages.sh --list     print the packages, one a line, and exit
#
# Tier (pytest marker)  packages
#   slurm               munge mariadb-server slurm-wlm slurmctld slurmd slurmdbd slurm-client procps
#                       (tests/slurm/cluster-up.sh brings the cluster up from them)
#   browser             chromium chromium-driver (driven by selenium)
#   image               squashfs-tools (mksquashfs, unsquashfs: `vcloud image`)
#   container           bubblewrap (bwrap: the strict apptainer stand-in)
set -euo pipefail

PACKAGES=(
    munge mariadb-server slurm-wlm slurmctld slurmd slurmdbd slurm-client procps
    chromium chromium-driver
    squashfs-tools
    bubblewrap
)

if [[ ${1:-} == --list ]]; then
    printf '%s\n' "${PACKAGES[@]}"
    exit 0
fi
if [[ $(id -u) != 0 ]]; then
    echo "system-packages: needs root (apt-get install ${PACKAGES[*]})" >&2
    exit 1
fi
command -v apt-get >/dev/null || {
    echo "system-packages: no apt-get here; install ${PACKAGES[*]} with this system's package manager" >&2
    exit 1
}

missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
    echo "system-packages: all ${#PACKAGES[@]} packages installed"
    exit 0
fi

echo "system-packages: installing ${missing[*]}"
# No init system in containers: keep package scripts from starting daemons with their default
# configs (tests/slurm/cluster-up.sh starts them with its own). Docker images ship this already.
policy_added=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    policy_added=1
fi
rc=0
{
    apt-get update -q -o DPkg::Lock::Timeout=300 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -o DPkg::Lock::Timeout=300 "${missing[@]}"
} || rc=$?
((policy_added)) && rm -f /usr/sbin/policy-rc.d
if ((rc != 0)); then
    echo "system-packages: apt-get failed (exit $rc)" >&2
    exit "$rc"
fi
echo "system-packages: installed ${missing[*]}"
