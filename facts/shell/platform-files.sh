# shellcheck shell=sh
# Print a platform's own containerd config and the *.toml beside it (k3s, RKE2, k0s) as
# config-files.sh prints a tree, without kinds and links (paths and texts in base64, B64...):
#   main PATH                   the config, CONFIG
#   file MTIME B64PATH B64TEXT  CONFIG and every *.toml at most two levels under ROOT (through links),
#                               each readable file, at most LIMIT bytes of its text
#   mode BITS B64PATH           its permission bits (octal)
#   owner UID:GID B64PATH       its numeric owner and group
# Usage: sh -c "$script" gpunode-platform-files CONFIG ROOT LIMIT
# Exit status: 0.
config=$1 root=$2 limit=$3
echo "main $config"
{
    echo "$config"
    find -L "$root" -maxdepth 2 -name '*.toml' -type f 2>/dev/null
} | sort -u | while read -r f; do
    if [ -r "$f" ] && [ -f "$f" ]; then
        b=$(printf %s "$f" | base64 -w0)
        echo "file $(stat -L -c %Y "$f") $b $(head -c "$limit" "$f" | base64 -w0)"
        echo "mode $(stat -L -c %a "$f") $b"
        echo "owner $(stat -L -c %u:%g "$f") $b"
    fi
done
exit 0
