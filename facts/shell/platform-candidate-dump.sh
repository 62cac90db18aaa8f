# shellcheck shell=sh
# Print `config dump` of a platform's candidate config (k3s, RKE2, k0s), as config-dump.sh prints it,
# by the platform's own containerd (BIN_DIR first on PATH): DROPINS/*.toml copied into a new temporary
# directory, the candidate CONFIG (in DROPINS' parent or beside it) and DROPIN written there, each from
# a base64 line of stdin (CONFIG's first). STAGE in CONFIG's text becomes the stage's path; the stage's
# path in containerd's messages becomes the node's own again. The stage is removed on exit; nothing is
# written outside it. Where the stage cannot be made the exit status line is `stage`.
# Usage: sh -c "$script" gpunode-platform-candidate-dump BIN_DIR CONFIG DROPINS DROPIN STAGE <CANDIDATES
# Exit status: 0 (non-zero only where no temporary directory could be made: nothing is printed then).
bin_dir=$1 config=$2 dropins=$3 dropin=$4 stage=$5
PATH=$bin_dir:$PATH
export PATH
T=$(mktemp -d) || exit
trap 'rm -rf "$T"' EXIT
S="$T/stage"
mkdir -p "$S$dropins" || exit
# Copy DROPINS/*.toml into the stage and write the candidates there (their text from stdin).
stage_candidate() {
    if ! { read -r c && read -r d; }; then
        echo "no candidate config on stdin" >&2
        return 1
    fi
    for f in "$dropins"/*.toml; do
        if [ -f "$f" ]; then cat "$f" >"$S$f" || return 1; fi
    done
    printf %s "$c" | base64 -d | sed "s#$stage#$S#g" >"$S$config" &&
        rm -f "$S$dropin" && printf %s "$d" | base64 -d >"$S$dropin"
}

if stage_candidate 2>"$T/err"; then
    containerd --config "$S$config" config dump 2>"$T/err"
    rc=$?
else
    rc=stage
fi
echo "### gpunode-stderr"
sed "s#$S##g" "$T/err"
echo "### gpunode-rc $rc"
