# shellcheck shell=sh
# Print what shows that a platform (k3s, RKE2, k0s, EKS nodeadm) runs containerd on this node, one
# line each (pyinfra_gpunode.platform.owning_platform reads them; it names the sources):
#   file PATH FIRST_LINE_BASE64   a config the platform generates, with its first non-blank line
#   dir PATH | unit NAME PATH | socket PATH | binary PATH
#   process PID UNIT              every containerd process and the systemd unit it runs in
#   toolkit PATH                  the toolkit's runtime where k3s and RKE2 look for it
#   runtimes PATH NAME...         the CRI runtimes the config k3s or RKE2 generated defines
# Reads only.
# Usage: sh -c "$script" gpunode-containerd-platform
# Exit status: 0.
for f in /var/lib/rancher/k3s/agent/etc/containerd/config.toml \
    /var/lib/rancher/rke2/agent/etc/containerd/config.toml /etc/k0s/containerd.toml; do
    if [ -f "$f" ] && [ -r "$f" ]; then
        printf 'file %s %s\n' "$f" "$(grep -m 1 -v '^[[:space:]]*$' "$f" | head -c 200 | base64 -w0)"
    fi
done
runtime_table="^[[:space:]]*\\[plugins\\.[\"'](io\\.containerd\\.grpc\\.v1\\.cri|io\\.containerd\\.cri\\.v1\\.runtime)[\"']"
for f in /var/lib/rancher/k3s/agent/etc/containerd/config.toml /var/lib/rancher/rke2/agent/etc/containerd/config.toml; do
    if [ -f "$f" ] && [ -r "$f" ]; then
        names=$(sed -nE "s/$runtime_table\\.containerd\\.runtimes\\.('([A-Za-z0-9_.-]+)'|\"([A-Za-z0-9_.-]+)\"|([A-Za-z0-9_-]+))\\][[:space:]]*\$/\\3\\4\\5/p" "$f" |
            head -n 64 | tr '\n' ' ')
        printf 'runtimes %s %s\n' "$f" "$names"
    fi
done
for t in /usr/local/nvidia/toolkit/nvidia-container-runtime /usr/bin/nvidia-container-runtime; do
    if [ -f "$t" ] && [ -x "$t" ]; then printf 'toolkit %s\n' "$t"; fi
done
if [ -d /etc/eks/nodeadm.d ]; then echo "dir /etc/eks/nodeadm.d"; fi
for u in k3s k3s-agent rke2-server rke2-agent k0sworker k0scontroller k0s nodeadm-config nodeadm-run; do
    for dir in /etc/systemd/system /usr/local/lib/systemd/system /usr/lib/systemd/system /lib/systemd/system; do
        if [ -f "$dir/$u.service" ]; then
            printf 'unit %s.service %s\n' "$u" "$dir/$u.service"
            break
        fi
    done
done
for s in /run/k3s/containerd/containerd.sock /run/k0s/containerd.sock; do
    if [ -S "$s" ]; then printf 'socket %s\n' "$s"; fi
done
if [ -f /usr/bin/nodeadm ]; then echo "binary /usr/bin/nodeadm"; fi
pgrep -x containerd 2>/dev/null | while read -r p; do
    # A short-lived `containerd config dump|default|migrate` (another run's read, an operator's) is no daemon.
    case " $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in *" config "*) continue ;; esac
    unit=$(awk -F: '$3 != "/" && ($2 == "" || $2 == "name=systemd") {n = split($3, a, "/"); print a[n]; exit}' \
        "/proc/$p/cgroup" 2>/dev/null)
    printf 'process %s %s\n' "$p" "${unit:-none}"
done
exit 0
