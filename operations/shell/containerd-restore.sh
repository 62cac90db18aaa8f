# shellcheck shell=sh
# Put the config tree back as the tar BACKUP holds it, entry by entry, into the directories as
# they are now (a mount point stays mounted, a directory keeps its inode):
# - under each ROOT, a directory of the backup gets its owner, group and mode (made if missing);
#   any other entry (a file, a link) is copied beside its path with the backup's owner, group,
#   mode and mtime and renamed over it;
# - each WRITTEN path (a file gpunode writes: the main config, our drop-in) that the backup lacks
#   is removed with its stray WRITTEN.gpunode-new, and so is its directory when the backup lacks
#   it and it is empty; files gpunode does not write are left alone;
# - the tree is then compared with the backup (type, content, link target, owner, group, mode),
#   and every difference is named.
# Links: entries are put back through the directories as they are, so where the user replaced a
# directory with a link the files land in the directory it points to and the link stays; a link
# in the backup is put back as that link; nothing beyond a link is removed.
# What a restored path held before goes aside under FAILED_DIR/containerd-<UTC time>/ (mode 0700,
# like the backups). The backup is unpacked under a temporary directory in /etc (umask 077),
# removed at the end.
# Usage: sh -c "$script" gpunode-restore BACKUP FAILED_DIR FAILURE ROOT... -- WRITTEN...
# Exit status: 0 when the tree equals the backup; 1, with FAILURE and what failed or differs on
# stderr, otherwise.
backup=$1
failed_dir=$2
failure=$3
shift 3
umask 077
problems=

fail() {
    rm -rf "$t"
    printf '%s: %s\n' "$failure" "$1" >&2
    exit 1
}

note() {
    problems="${problems:+$problems; }$1"
}

# Whether a directory above $1$2, below $1, is a symbolic link.
beneath_link() {
    above=$(dirname "$2")
    while [ "$above" != / ]; do
        if [ -L "$1$above" ]; then return 0; fi
        above=$(dirname "$above")
    done
    return 1
}

exists() {
    [ -e "$1" ] || [ -L "$1" ]
}

move_aside() {
    mkdir -p "$aside$(dirname "$1")" && mv "$1" "$aside$1"
}

copy_aside() {
    mkdir -p "$aside$(dirname "$1")" && cp -a "$1" "$aside$1"
}

# Put the backup's entry $1 (under $tree) at its path.
restore() {
    p=${1#"$tree"}
    if [ -d "$1" ] && [ ! -L "$1" ]; then
        if [ ! -d "$p" ]; then
            { ! exists "$p" || move_aside "$p"; } && mkdir "$p"
        fi && chown --reference="$1" "$p" && chmod --reference="$1" "$p"
    else
        new=$(dirname "$p")/.$(basename "$p").gpunode-restore
        if rm -rf "$new" && cp -a "$1" "$new" && {
            if [ -d "$p" ] && [ ! -L "$p" ]; then move_aside "$p"; elif exists "$p"; then copy_aside "$p"; fi
        } && mv -fT "$new" "$p"; then
            return 0
        fi
        rm -rf "$new"
        return 1
    fi
}

# Name how the path of the backup's entry $1 (under $tree) differs from it.
compare() {
    p=${1#"$tree"}
    if [ -L "$1" ]; then
        if [ ! -L "$p" ] || [ "$(readlink "$p")" != "$(readlink "$1")" ]; then note "$p is not the link to $(readlink "$1")"; fi
        return
    fi
    if [ -d "$1" ]; then
        [ -d "$p" ] || note "$p is not a directory"
    elif [ -L "$p" ] || [ ! -f "$p" ]; then
        note "$p is not a regular file"
    elif ! cmp -s "$1" "$p"; then
        note "$p has other content"
    fi
    now=$(stat -L -c %u:%g:%a "$p" 2>/dev/null)
    saved=$(stat -c %u:%g:%a "$1")
    [ "$now" = "$saved" ] || note "$p is owner:group:mode ${now:-missing}, the backup's $saved"
}

t=$(mktemp -d /etc/.gpunode-restore.XXXXXX) || fail "no temporary directory"
tree=$t/tree
aside=$failed_dir/containerd-$(date -u +%Y%m%dT%H%M%S.%NZ)
if ! { mkdir "$tree" && tar -C "$tree" -xpf "$backup" --numeric-owner; }; then fail "could not unpack $backup"; fi
install -d -m 0700 "$failed_dir" "$aside" || fail "could not make $aside"
nl='
'
# find lists each directory before what it holds and does not follow links.
: > "$t/list"
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
    if exists "$tree$1"; then find "$tree$1" >> "$t/list" || fail "could not list $1 in the backup"; fi
    shift
done
[ "$#" -gt 0 ] && shift
[ -z "$(find "$tree" -name "*$nl*")" ] || fail "the backup holds a name with a line break"

while IFS= read -r entry; do
    restore "$entry" || note "could not put back ${entry#"$tree"}"
done < "$t/list"
for written in "$@"; do
    if beneath_link "$tree" "$written" || exists "$tree$written" || beneath_link "" "$written"; then continue; fi
    for f in "$written" "$written.gpunode-new"; do
        if exists "$f"; then move_aside "$f" || note "could not move $f aside"; fi
    done
    dir=$(dirname "$written")
    while [ "$dir" != / ] && [ ! -d "$tree$dir" ] && rmdir "$dir" 2>/dev/null; do dir=$(dirname "$dir"); done
done
chmod -R go-rwx "$aside"

while IFS= read -r entry; do
    compare "$entry"
done < "$t/list"
for written in "$@"; do
    if beneath_link "$tree" "$written" || exists "$tree$written" || beneath_link "" "$written"; then continue; fi
    ! exists "$written" || note "$written is still there, the backup has none"
done
[ -z "$problems" ] || fail "the tree differs from the backup: $problems"
rm -rf "$t"
