// tests/tokenizer/ref.mjs: the independent implementation the suite and the bench compare
// against: Hugging Face's tokenizers.js (@huggingface/tokenizers) on a tokenizer.json, or the
// tiktoken port (js-tiktoken, GPT-2's ranks). Installed by `make deps` (tests/tokenizer/deps.sh).
//   node ref.mjs encode TOKENIZER.json FILE...   ids of each file (one document), a line each;
//                                                a FILE.jsonl: of each line's "text", a line each
//   node ref.mjs bench hf|tiktoken TOKENIZER.json FILE...   MB/s of encoding them (one thread)
// Files are read as UTF-8 (invalid bytes become U+FFFD, as node's decoder does).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(process.env.TOK_NPM_DIR || join(here, "../../build/npm"),
                                   "node_modules", "x.js"));

function hf(path) {
    const { Tokenizer } = require("@huggingface/tokenizers");
    const t = new Tokenizer(JSON.parse(readFileSync(path, "utf8")), {});
    return (s) => t.encode(s, { add_special_tokens: false }).ids;
}

function tiktoken() {
    const { Tiktoken } = require("js-tiktoken/lite");
    const gpt2 = require("js-tiktoken/ranks/gpt2");
    const t = new Tiktoken(gpt2.default || gpt2);
    return (s) => t.encode(s, "all");
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "encode") {
    const enc = hf(args[0]);
    for (const f of args.slice(1)) {
        if (!f.endsWith(".jsonl")) console.log(enc(readFileSync(f, "utf8")).join(" "));
        else for (const line of readFileSync(f, "utf8").split("\n"))
            if (line.trim()) console.log(enc(JSON.parse(line).text).join(" "));
    }
} else if (cmd === "bench") {
    const enc = args[0] === "tiktoken" ? tiktoken() : hf(args[1]);
    const lines = (f) => readFileSync(f, "utf8").split("\n").filter((l) => l.trim());
    const texts = args.slice(2).flatMap((f) => !f.endsWith(".jsonl") ? [readFileSync(f, "utf8")]
        : lines(f).map((l) => JSON.parse(l).text));
    const bytes = texts.reduce((a, s) => a + Buffer.byteLength(s), 0);
    enc(texts[0].slice(0, 10000));   // warm up
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (const s of texts) n += enc(s).length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`${(bytes / 1e6 / dt).toFixed(2)} MB/s ${n} tokens`);
} else {
    console.error("usage: node ref.mjs encode|bench ...");
    process.exit(2);
}
