#!/usr/bin/env bash
# Start JupyterLab the way Hugging Face's JupyterLab Space template does: behind a token,
# embeddable in the Space page (frame-ancestors), cookies that work inside that frame.
# The token is the Space secret JUPYTER_TOKEN; a public URL without one is refused.
set -euo pipefail
if [ -z "${JUPYTER_TOKEN:-}" ]; then
  echo "JUPYTER_TOKEN is not set: add it as a secret in the Space's settings (anyone with the" >&2
  echo "Space's URL could otherwise run code in it), then restart the Space." >&2
  exit 1
fi
exec jupyter lab --ip=0.0.0.0 --port=7860 --no-browser \
  --ServerApp.token="$JUPYTER_TOKEN" \
  --ServerApp.tornado_settings="{'headers': {'Content-Security-Policy': 'frame-ancestors *'}}" \
  --ServerApp.cookie_options="{'SameSite': 'None', 'Secure': True}" \
  --ServerApp.disable_check_xsrf=True \
  --LabApp.news_url=None \
  --LabApp.check_for_updates_class="jupyterlab.NeverCheckForUpdate" \
  --ServerApp.root_dir=/home/user/course/book
