# shellcheck shell=sh
# Run the toolkit's CDI refresh now and read its result: start SERVICE (a oneshot: systemctl waits
# for it), then require SPEC to have been written by it (present, and changed when it was there
# before); on failure print the service's last journal lines.
# Usage: sh -c "$script" gpunode-cdi-refresh SERVICE SPEC
# Exit status: 0 when the service succeeded and wrote SPEC; 1 otherwise (nothing else changed).
service=$1 spec=$2
before=$(stat -c %Y:%i "$spec" 2>/dev/null)
systemctl reset-failed "$service" 2>/dev/null
if ! systemctl start "$service"; then
    echo "$service failed; its last journal lines:" >&2
    journalctl -u "$service" -b -n 20 --no-pager >&2
    exit 1
fi
after=$(stat -c %Y:%i "$spec" 2>/dev/null)
if [ -z "$after" ] || [ "$after" = "$before" ]; then
    echo "$service ran but wrote no $spec (its ExecCondition or ConditionPathExists was not met):" >&2
    journalctl -u "$service" -b -n 20 --no-pager >&2
    exit 1
fi
exit 0
