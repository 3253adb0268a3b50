// `npm pack` and `npm publish` build the package first (prepack).  From a clean checkout the build's tools
// (TypeScript, a dev dependency) are not installed yet, so they are installed here from the lock file
// (`npm ci`, scripts off; the npm cache is used when it has them), then `npm run build` makes dist/.
// The child's output goes to stderr: `npm pack --json` keeps stdout for its JSON.
'use strict';
const { execSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
const run = (command) => execSync(command, { cwd: root, stdio: ['ignore', 2, 2] });
if (!fs.existsSync(path.join(root, 'node_modules', 'typescript', 'bin', 'tsc'))) {
  run('npm ci --ignore-scripts --no-audit --no-fund --prefer-offline');
}
run('npm run build');
