// `npm install ./clients/typescript` (a folder: npm links it and runs this `prepare`, but without installing
// its devDependencies) and `npm pack` both need dist/ built: install the compiler when it is missing, then
// build. `--ignore-scripts` keeps that inner install from running this script again.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const npm = process.env.npm_execpath ? [process.execPath, process.env.npm_execpath] : ["npm"];
const run = (...args) => execFileSync(npm[0], [...npm.slice(1), ...args], { cwd: root, stdio: "inherit" });

if (!existsSync(join(root, "node_modules", "typescript", "bin", "tsc"))) {
  run("ci", "--ignore-scripts", "--no-audit", "--no-fund");
}
run("run", "build");
