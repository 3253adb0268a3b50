"""The npm package of bindings/typescript as a user gets it: ``npm pack`` (whose ``prepack`` builds) must
contain the built JavaScript and the .d.ts files of both module formats and nothing else, and a project
that installs the tarball must load it with ``require`` and ``import``, for the core and the ``/node``
entry, and type-check against it under both of TypeScript's module resolutions users have (node16 and
bundler).

npm comes from ``PYMQ_NPM`` (``eval "$(.ci/interop-clients.sh)"``); without it the test skips, or fails
when ``CI`` is set (the rule of tests/storage/services.py).  Nothing is fetched: the tarball has no
dependencies, and TypeScript is the binding's own dev dependency.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tarfile

from tests.interop.foreign import PROVIDER
from tests.storage.services import service_url

BINDING = pathlib.Path(__file__).parents[2] / "bindings" / "typescript"

#: what the package must hold (besides package.json and README.md)
ENTRIES = [f"dist/{fmt}/{name}.{ext}" for fmt in ("cjs", "esm") for name in ("index", "node", "client", "websocket")
           for ext in ("js", "d.ts")]

CONSUMER_TS = """
import { connect, Message, webSocket, type Connection, type Status } from '@pymq/client';
import { tcp, connect as connectNode, type NodeConnectOptions } from '@pymq/client/node';

const status: Status = 'open';
const options: NodeConnectOptions = { host: '127.0.0.1', port: 61613, reconnect: { initialDelayMs: 50 } };
export async function use(): Promise<Connection> {
  const c = await connect({ connector: webSocket('ws://127.0.0.1:1/stomp'), heartBeat: false });
  await c.send('/queue/x', Message.text('typed').setProperty('n', 1));
  void tcp; void connectNode; void options; void status;
  return c;
}
"""


def run(argv: list[str], cwd: pathlib.Path, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def test_npm_pack_holds_the_build_and_installs_with_types(tmp_path):
    npm = service_url("PYMQ_NPM", "npm for bindings/typescript", PROVIDER)
    out = run([npm, "pack", "--json", "--pack-destination", str(tmp_path)], BINDING)
    info = json.loads(out.stdout[out.stdout.index("["):])[0]
    tarball = tmp_path / info["filename"]
    with tarfile.open(tarball) as tar:
        names = {n.removeprefix("package/") for n in tar.getnames()}
    missing = [e for e in ENTRIES if e not in names]
    assert not missing, f"npm pack lacks {missing}; it holds {sorted(names)}"
    assert {"package.json", "README.md", "dist/cjs/package.json", "dist/esm/package.json"} <= names
    strays = sorted(n for n in names if n.startswith(("src/", "test/", "build/", "node_modules/")) or ".test." in n)
    assert not strays, f"npm pack must hold the build only, not {strays}"

    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "version": "1.0.0", "private": True}))
    run([npm, "install", "--no-audit", "--no-fund", "--offline", str(tarball)], app)
    env = dict(os.environ)
    checks = {
        "require": "const c = require('@pymq/client'); const n = require('@pymq/client/node');"
                   "if (typeof c.connect !== 'function' || typeof c.webSocket !== 'function' || typeof n.tcp !== 'function'"
                   " || c.Message.text('x').text !== 'x') process.exit(1);",
        "import": "const c = await import('@pymq/client'); const n = await import('@pymq/client/node');"
                  "if (typeof c.connect !== 'function' || typeof n.tcp !== 'function' || n.Message !== c.Message)"
                  " process.exit(1);",
    }
    run(["node", "-e", checks["require"]], app, env=env)
    run(["node", "--input-type=module", "-e", checks["import"]], app, env=env)

    tsc = BINDING / "node_modules" / "typescript" / "bin" / "tsc"
    (app / "use.ts").write_text(CONSUMER_TS)
    (app / "node_modules" / "@types").mkdir(exist_ok=True)
    node_types = BINDING / "node_modules" / "@types" / "node"
    link = app / "node_modules" / "@types" / "node"
    if not link.exists():
        link.symlink_to(node_types, target_is_directory=True)
    for module, resolution in (("node16", "node16"), ("esnext", "bundler")):
        run(["node", str(tsc), "--noEmit", "--strict", "--module", module, "--moduleResolution", resolution,
             "--target", "es2022", "--lib", "es2022,dom", "--types", "node", "use.ts"], app)
