// Marks dist/cjs as CommonJS and dist/esm as ES modules, so Node loads each build as what it is whatever
// the package's own "type" says.
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..', 'dist');
fs.writeFileSync(path.join(root, 'cjs', 'package.json'), JSON.stringify({ type: 'commonjs' }) + '\n');
fs.writeFileSync(path.join(root, 'esm', 'package.json'), JSON.stringify({ type: 'module' }) + '\n');
