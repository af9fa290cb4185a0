#!/bin/bash
# The official redis image's interface, on Debian's redis-server package:
# options (or a .conf file) after the image name go to redis-server, which
# runs as the redis user in /data with PID 1.
set -euo pipefail
if [ "${1:0:1}" = "-" ] || [ "${1%.conf}" != "$1" ]; then
  set -- redis-server "$@"
fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
  chown redis:redis .
  exec setpriv --reuid=redis --regid=redis --init-groups -- "$@"
fi
exec "$@"
