# shellcheck shell=sh
# Put PATHs back as the tar BACKUP holds them (removing those it lacks): each PATH there now goes
# aside under FAILED_DIR/containerd-<UTC time>/ (mode 0700, like the backups), then the backup's
# copy, if it has one, takes its place. The backup is unpacked into a temporary directory under
# /etc (umask 077) first and that directory is removed at the end.
# Usage: sh -c "$script" gpunode-restore BACKUP FAILED_DIR FAILURE PATH...
# Exit status: 0 when every PATH was put back; 1, with FAILURE on stderr, when anything failed
# (unpacking, making the aside directory, moving a PATH).
backup=$1
failed_dir=$2
failure=$3
shift 3
umask 077
# A failed mktemp and a failed restore both end in the failure branch.
# shellcheck disable=SC2015
t=$(mktemp -d /etc/.gpunode-restore.XXXXXX) && {
    tar -C "$t" -xf "$backup" &&
        aside=$failed_dir/containerd-$(date -u +%Y%m%dT%H%M%S.%NZ) &&
        install -d -m 0700 "$failed_dir" "$aside" &&
        ok=1 &&
        for p in "$@"; do
            # A move that fails marks the restore failed and the loop goes on with the next PATH.
            # shellcheck disable=SC2015
            if [ -e "$p" ] || [ -L "$p" ]; then mkdir -p "$aside$(dirname "$p")" && mv "$p" "$aside$p" || ok=0; fi
            if [ -e "$t$p" ] || [ -L "$t$p" ]; then mv "$t$p" "$p" || ok=0; fi
        done &&
        chmod -R go-rwx "$aside" && [ "$ok" = 1 ]
} || {
    rm -rf "$t"
    printf '%s\n' "$failure" >&2
    exit 1
}
rm -rf "$t"
