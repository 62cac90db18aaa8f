# shellcheck shell=sh
# Print containerd's config tree, a line for each fact, paths and texts in base64 (B64...):
#   main PATH                   the main config, CONFIG
#   file MTIME B64PATH B64TEXT  CONFIG and every *.toml under ROOT (through links), each readable file
#   mode BITS B64PATH           its permission bits (octal)
#   owner UID:GID B64PATH       its numeric owner and group
#   kind B64PATH TYPE           stat's file type of CONFIG, of DROPIN and of each directory above them
#                               that exists and is not a symbolic link
#   link B64PATH B64TARGET      every symbolic link under ROOT, and CONFIG or a directory above it that is one
# Usage: sh -c "$script" gpunode-config-files CONFIG ROOT DROPIN
# Exit status: 0.
cfg=$1 root=$2 dropin=$3
b64() { printf %s "$1" | base64 -w0; }
echo "main $cfg"
{
    echo "$cfg"
    find -L "$root" -name "*.toml" -type f 2>/dev/null
} | sort -u | while read -r f; do
    if [ -r "$f" ] && [ -f "$f" ]; then
        b=$(b64 "$f")
        echo "file $(stat -c %Y "$f") $b $(base64 -w0 <"$f")"
        echo "mode $(stat -L -c %a "$f") $b"
        echo "owner $(stat -L -c %u:%g "$f") $b"
    fi
done
for f in "$cfg" "$dropin"; do
    p=$f
    while [ "${#p}" -gt 1 ]; do
        if [ -e "$p" ] && [ ! -L "$p" ]; then echo "kind $(b64 "$p") $(stat -c %F "$p")"; fi
        p=$(dirname "$p")
    done
done | sort -u
{
    find "$root" -type l 2>/dev/null
    p=$cfg
    while [ "${#p}" -gt 1 ]; do
        echo "$p"
        p=$(dirname "$p")
    done
} | sort -u | while read -r f; do
    if [ -L "$f" ]; then echo "link $(b64 "$f") $(b64 "$(readlink "$f")")"; fi
done
exit 0
