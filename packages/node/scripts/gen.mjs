// Generates what the package ships besides its own code (run by `npm run
// build`, so by `npm pack` too):
//
//   LICENSE             the repository's;
//   proto/              the .proto files of the repository's proto/agentrt,
//                       and google/rpc/status.proto and error_details.proto
//                       from google-proto-files (with their licence), which
//                       the package loads at run time;
//   src/gen/            their TypeScript types, by proto-loader-gen-types
//                       with the options src/api.ts loads them with.

import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const repoProto = path.resolve(here, "..", "..", "proto");
const googleProtos = path.join(here, "node_modules", "google-proto-files");
const out = path.join(here, "proto");
const gen = path.join(here, "src", "gen");

/** Every file under `dir` (relative paths) whose name ends in `suffix`. */
function walk(dir, suffix, rel = "") {
  return fs.readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((entry) => {
    const sub = path.join(rel, entry.name);
    if (entry.isDirectory()) return walk(dir, suffix, sub);
    return entry.name.endsWith(suffix) ? [sub] : [];
  });
}

function copy(from, to) {
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.copyFileSync(from, to);
}

fs.rmSync(out, { recursive: true, force: true });
fs.rmSync(gen, { recursive: true, force: true });

const agentrt = walk(repoProto, ".proto", "agentrt").sort();
if (agentrt.length === 0) throw new Error(`no .proto files under ${repoProto}/agentrt`);
for (const file of agentrt) copy(path.join(repoProto, file), path.join(out, file));
copy(path.join(repoProto, "..", "LICENSE"), path.join(here, "LICENSE"));
const rpc = ["google/rpc/status.proto", "google/rpc/error_details.proto"];
for (const file of rpc) copy(path.join(googleProtos, file), path.join(out, file));
copy(path.join(googleProtos, "LICENSE"), path.join(out, "google", "rpc", "LICENSE"));

execFileSync(
  path.join(here, "node_modules", ".bin", "proto-loader-gen-types"),
  [
    "--grpcLib=@grpc/grpc-js",
    "--keepCase",
    "--longs=Number",
    "--enums=String",
    "--defaults",
    "--oneofs",
    "-I",
    out,
    `--outDir=${gen}`,
    ...agentrt,
    ...rpc,
  ],
  { stdio: "inherit" },
);

// The package is an ES module: its relative imports name the .js file; the
// comments name each .proto relative to proto/, not the build machine.
for (const file of walk(gen, ".ts")) {
  const full = path.join(gen, file);
  const text = fs.readFileSync(full, "utf8");
  const relative = text
    .replace(/(from\s+['"])(\.{1,2}\/[^'"]+)(['"])/g, "$1$2.js$3")
    .replaceAll(`${out}${path.sep}`, "");
  fs.writeFileSync(full, relative);
}
console.log(`gen: ${agentrt.length + rpc.length} .proto files, types in src/gen`);
