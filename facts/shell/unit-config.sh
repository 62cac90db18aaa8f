# shellcheck shell=sh
# Print the config path as the containerd unit starts containerd: `--config X`, `--config=X` or
# `-c X` in its ExecStart, the first one; DEFAULT when ExecStart names none (or there is no unit).
# Usage: sh -c "$script" gpunode-unit-config DEFAULT
# Exit status: 0.
cfg=$(systemctl show -p ExecStart --value containerd 2>/dev/null |
    sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p' |
    awk '{for (i = 1; i <= NF; i++) { if ($i == "--config" || $i == "-c") print $(i+1); else if ($i ~ /^--config=/) print substr($i, 10) }}' |
    head -n 1)
printf '%s\n' "${cfg:-$1}"
