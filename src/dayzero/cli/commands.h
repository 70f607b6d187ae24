#pragma once
// Each subcommand of `dayzero` adds itself to the CLI11 app and returns the function that runs it.

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dz::cli {

using RunCommand = std::function<int()>;

// The process's command line as main() received it (`serve` starts its workers with it).
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

// `dayzero inspect DIR`: architecture, layer schedule, parameters and bytes by component and dtype.
RunCommand add_inspect_command(CLI::App& app);
// `dayzero analyze CONFIG_OR_DIR [--tp T] [--ep E] [--cp C] [--context L] [--batch B] [--json]`:
// what a config needs (layers, memory and communication per rank, supported operators).
RunCommand add_analyze_command(CLI::App& app);
// `dayzero bench ...`: `limits` measures the machine; later issues add operator benchmarks.
RunCommand add_bench_command(CLI::App& app);
// `dayzero tokenize --model DIR (--text T | --ids 1,2,3 | --batch FILE.json)`.
RunCommand add_tokenize_command(CLI::App& app);
// `dayzero logits --model DIR --token-ids 1,2,3 --output FILE.npy [--prefill-chunk N]
// [--decode-from K] [--kv-cache-dtype fp8|bf16] [--threads N]`.
RunCommand add_logits_command(CLI::App& app);
// `dayzero generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
// [--seed S]`.
RunCommand add_generate_command(CLI::App& app);
// `dayzero perplexity [--model DIR] (--file TEXT | --token-ids-file IDS) [--context N]
// [--max-windows K] [--bos] [--json]`: llama-perplexity over windows of N tokens.
RunCommand add_perplexity_command(CLI::App& app);
// `dayzero verify --model DIR [--token-ids 1,2,3] [--kv-cache-dtype fp8|bf16] [--python PATH]`.
RunCommand add_verify_command(CLI::App& app);
// `dayzero serve --model DIR [--host H] [--port P] [--api-key KEY]... [--max-queued-requests N]`
// plus the engine flags: the OpenAI-compatible server (serve/server.h).
RunCommand add_serve_command(CLI::App& app);
// `dayzero chat-template --model DIR --messages FILE.json [--add-generation-prompt]
// [--tools FILE.json] [--kwargs JSON] [--thinking]`, or `--batch FILE.json`.
RunCommand add_chat_template_command(CLI::App& app);

}  // namespace dz::cli
