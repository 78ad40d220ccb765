// The official OpenAI client library (the npm package "openai", v4) against
// step 07's server: the calls a client makes, each checked against what the
// API contract (step07_batching/serve/completion_api.hpp) promises.
//
//   node check.mjs http://127.0.0.1:PORT
//
// scripts/openai_client_check.sh installs the library, starts the server with
// stories260K and runs this. One line per check ("ok  completion: ..."); the
// first failure prints what differed and exits 1. The checks run in order and
// some use an earlier one's answer (the greedy completion is the reference of
// the stream, the chat and the stop string).
import { isDeepStrictEqual } from "node:util";

import OpenAI from "openai";

const serverUrl = process.argv[2];
if (!serverUrl) {
  console.error("usage: node check.mjs http://127.0.0.1:PORT");
  process.exit(2);
}
// No retries: a failure shows at once, as it is, instead of after the
// client's back-off. The timeout only bounds a hung server: every call here
// takes milliseconds on stories260K.
const client = new OpenAI({ baseURL: `${serverUrl}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30_000 });

const prompt = "Once upon a time";
// Short enough to end by length (stories260K's first story is longer), so
// the greedy answer's finish_reason is known.
const maxTokens = 24;

class CheckFailed extends Error {}

function expect(condition, what) {
  if (!condition) throw new CheckFailed(what);
}

function expectEqual(actual, expected, what) {
  if (!isDeepStrictEqual(actual, expected))
    throw new CheckFailed(`${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
}

// A log-probability: finite (NaN fails) and at most 0.
function expectLogprob(value, what) {
  expect(Number.isFinite(value) && value <= 0, `${what}: ${value} is no log-probability (finite, <= 0)`);
}

// A usage object: whole numbers that add up, the completion's count as expected.
function expectUsage(usage, completionTokens, what) {
  expect(usage != null, `${what}: no usage`);
  const { prompt_tokens: promptTokens, completion_tokens: generated, total_tokens: total } = usage;
  expect(Number.isInteger(promptTokens) && promptTokens > 0, `${what}: prompt_tokens ${promptTokens}`);
  expectEqual(generated, completionTokens, `${what}: completion_tokens`);
  expectEqual(total, promptTokens + generated, `${what}: total_tokens (prompt + completion)`);
}

// Reads a whole stream of completion chunks: each choice's text (and, for
// chat, its role) and finish_reason, and the usage of the last chunk.
async function readStream(stream, { chat = false } = {}) {
  const choices = [];  // [n] by index: {text, role, finish, chunks}
  let id = null;
  let lastChunk = null;
  for await (const chunk of stream) {
    id ??= chunk.id;
    expectEqual(chunk.id, id, "every chunk's id");
    expectEqual(chunk.object, chat ? "chat.completion.chunk" : "text_completion", "a chunk's object");
    for (const choice of chunk.choices) {
      const seen = (choices[choice.index] ??= { text: "", role: null, finish: null, chunks: 0 });
      expect(seen.finish === null, `choice ${choice.index} has a chunk after its finish_reason`);
      if (chat) {
        if (seen.chunks === 0) seen.role = choice.delta.role ?? null;
        seen.text += choice.delta.content ?? "";
      } else {
        seen.text += choice.text;
      }
      seen.finish = choice.finish_reason;
      seen.chunks += 1;
    }
    lastChunk = chunk;
  }
  expect(lastChunk !== null, "the stream had no chunk");
  return { id, choices, lastChunk };
}

// Calls `request`, which must fail with the client's APIError: `status`, and
// `param` the field at fault.
async function expectApiError(what, request, status, param) {
  try {
    await request();
  } catch (error) {
    expect(error instanceof OpenAI.APIError, `${what}: not the client's APIError but ${error}`);
    expectEqual(error.status, status, `${what}: status (${error.message})`);
    expectEqual(error.param, param, `${what}: the error's param (${error.message})`);
    return error;
  }
  throw new CheckFailed(`${what}: the request succeeded`);
}

async function serverStats() {
  const response = await fetch(`${serverUrl}/v1/stats`);
  expectEqual(response.status, 200, "GET /v1/stats");
  return response.json();
}

// Polls /v1/stats until nothing runs and no block is held, for at most `seconds`.
async function waitUntilIdle(seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const stats = await serverStats();
    if (stats.running === 0 && stats.waiting === 0 && stats.blocks_used === 0) return stats;
    if (Date.now() > deadline)
      throw new CheckFailed(`the server is not idle ${seconds} s later: ${JSON.stringify(stats)}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// ---- the checks, in order ----

// 1. GET /v1/models: the one model served. Returns its id.
async function models() {
  const page = await client.models.list();
  expectEqual(page.data.length, 1, "models listed");
  const [model] = page.data;
  expectEqual(model.object, "model", "the model's object");
  expect(typeof model.id === "string" && model.id.length > 0, `the model's id: ${JSON.stringify(model.id)}`);
  return { line: `one model, "${model.id}"`, result: model.id };
}

// 2. A greedy completion, the reference of the checks after it.
async function completion(modelId) {
  const answer = await client.completions.create({ model: modelId, prompt, max_tokens: maxTokens, temperature: 0 });
  expect(answer.id.startsWith("cmpl-"), `the id "${answer.id}" does not start with "cmpl-"`);
  expectEqual(answer.object, "text_completion", "object");
  expectEqual(answer.model, modelId, "the model (as GET /v1/models names it)");
  expectEqual(answer.choices.length, 1, "choices");
  const [choice] = answer.choices;
  expectEqual(choice.index, 0, "the choice's index");
  expect(choice.text.length > 0, "the text is empty");
  expectEqual(choice.finish_reason, "length", "finish_reason");
  expectUsage(answer.usage, maxTokens, "usage");
  return { line: `${JSON.stringify(choice.text)}, usage ${JSON.stringify(answer.usage)}`, result: answer };
}

// 3. The same, streamed: the chunks' text is the whole answer's, and the
// last chunk (no choices) carries the same usage.
async function completionStream(reference) {
  const stream = await client.completions.create({
    model: reference.model, prompt, max_tokens: maxTokens, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  const { id, choices, lastChunk } = await readStream(stream);
  expect(id.startsWith("cmpl-"), `the id "${id}" does not start with "cmpl-"`);
  expectEqual(choices.length, 1, "choices streamed");
  expectEqual(choices[0].text, reference.choices[0].text, "the streamed text");
  expectEqual(choices[0].finish, "length", "the last finish_reason");
  expectEqual(lastChunk.choices, [], "the last chunk's choices");
  expectEqual(lastChunk.usage, reference.usage, "the last chunk's usage");
  return { line: `${choices[0].chunks} chunks, the same text and usage` };
}

// 4. Chat with one user message: the plain-text chat template makes it the
// same prompt, so the answer is the completion's.
async function chat(reference) {
  const answer = await client.chat.completions.create({
    model: reference.model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0,
  });
  expect(answer.id.startsWith("chatcmpl-"), `the id "${answer.id}" does not start with "chatcmpl-"`);
  expectEqual(answer.object, "chat.completion", "object");
  expectEqual(answer.model, reference.model, "the model");
  expectEqual(answer.choices.length, 1, "choices");
  const [choice] = answer.choices;
  expectEqual(choice.message.role, "assistant", "the message's role");
  expectEqual(choice.message.content, reference.choices[0].text, "the message's content (the completion's text)");
  expectEqual(choice.finish_reason, "length", "finish_reason");
  expectEqual(answer.usage, reference.usage, "usage (the completion's)");
  return { line: `role assistant, the completion's text and usage`, result: answer };
}

// 5. The chat streamed: the first delta names the role, the deltas add up to
// the chat answer's content.
async function chatStream(chatReference) {
  const stream = await client.chat.completions.create({
    model: chatReference.model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens,
    temperature: 0, stream: true,
  });
  const { id, choices } = await readStream(stream, { chat: true });
  expect(id.startsWith("chatcmpl-"), `the id "${id}" does not start with "chatcmpl-"`);
  expectEqual(choices.length, 1, "choices streamed");
  expectEqual(choices[0].role, "assistant", "the first delta's role");
  expectEqual(choices[0].text, chatReference.choices[0].message.content, "the deltas' content");
  expectEqual(choices[0].finish, "length", "the last finish_reason");
  return { line: `${choices[0].chunks} deltas, role assistant first, the same content` };
}

// 6. n = 4 sampled completions of one prompt: indices 0..3, reproducible from
// the seed, sample j seeded seed + j (so choice 0 is the n = 1 answer), and
// not all the same.
async function severalChoices(modelId) {
  const request = { model: modelId, prompt, max_tokens: maxTokens, temperature: 1, seed: 7 };
  const texts = (answer) => answer.choices.map((choice) => choice.text);
  const first = await client.completions.create({ ...request, n: 4 });
  expectEqual(first.choices.map((choice) => choice.index), [0, 1, 2, 3], "the choices' indices");
  for (const choice of first.choices) expect(choice.text.length > 0, `choice ${choice.index}'s text is empty`);
  const again = await client.completions.create({ ...request, n: 4 });
  expectEqual(texts(again), texts(first), "the same request again (same seed)");
  const alone = await client.completions.create({ ...request, n: 1 });
  expectEqual(alone.choices[0].text, first.choices[0].text, "n = 1 with the same seed against choice 0");
  const distinct = new Set(texts(first)).size;
  expect(distinct > 1, `all four choices are the same text: ${JSON.stringify(first.choices[0].text)}`);
  return { line: `indices 0..3, ${distinct} distinct texts, reproducible, choice 0 = the n = 1 answer` };
}

// 7. A stop string taken from the greedy answer: the text ends just before its
// first occurrence, finish_reason "stop"; whole and streamed (there as an array).
async function stop(reference) {
  const text = reference.choices[0].text;
  // The second word with its leading space (" there" in ", there was ..."):
  // the answer's text up to it is not empty.
  const words = text.match(/ \S+/g) ?? [];
  expect(words.length >= 2, `no second word to stop at in ${JSON.stringify(text)}`);
  const stopString = words[1];
  const expected = text.slice(0, text.indexOf(stopString));
  const request = { model: reference.model, prompt, max_tokens: maxTokens, temperature: 0 };

  const answer = await client.completions.create({ ...request, stop: stopString });
  expectEqual(answer.choices[0].text, expected, `the text with stop ${JSON.stringify(stopString)}`);
  expectEqual(answer.choices[0].finish_reason, "stop", "finish_reason");
  expect(answer.usage.completion_tokens < maxTokens, `completion_tokens ${answer.usage.completion_tokens}`);

  const stream = await client.completions.create({ ...request, stop: [stopString, "never in a story"], stream: true });
  const { choices } = await readStream(stream);
  expectEqual(choices[0].text, expected, "the streamed text with the stop array");
  expectEqual(choices[0].finish, "stop", "the streamed finish_reason");
  return { line: `stop ${JSON.stringify(stopString)}: ${JSON.stringify(expected)}, finish_reason stop, streamed too` };
}

// 8. Log-probabilities. Completions (logprobs: 3): per token its text, its
// log-probability and the top 3; greedy picks the most likely one. Chat
// (logprobs: true, top_logprobs: 2): entries with token, logprob and bytes.
async function logprobs(reference) {
  const answer = await client.completions.create({
    model: reference.model, prompt, max_tokens: maxTokens, temperature: 0, logprobs: 3,
  });
  const [choice] = answer.choices;
  expectEqual(choice.text, reference.choices[0].text, "the text with logprobs");
  const { tokens, token_logprobs: tokenLogprobs, top_logprobs: topLogprobs } = choice.logprobs ?? {};
  expect(Array.isArray(tokens) && tokens.length === maxTokens, `logprobs.tokens: ${JSON.stringify(tokens)}`);
  expectEqual(tokens.join(""), choice.text, "the tokens' text joined");
  expectEqual(tokenLogprobs.length, maxTokens, "token_logprobs entries");
  expectEqual(topLogprobs.length, maxTokens, "top_logprobs entries");
  tokens.forEach((token, position) => {
    const where = `token ${position} (${JSON.stringify(token)})`;
    expectLogprob(tokenLogprobs[position], `${where}'s logprob`);
    const top = Object.values(topLogprobs[position]);
    expectEqual(top.length, 3, `${where}: alternatives in top_logprobs`);
    top.forEach((value) => expectLogprob(value, `${where}: a top logprob`));
    expectEqual(tokenLogprobs[position], Math.max(...top), `${where}: greedy's logprob against the top one`);
  });

  const chatAnswer = await client.chat.completions.create({
    model: reference.model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0,
    logprobs: true, top_logprobs: 2,
  });
  const content = chatAnswer.choices[0].logprobs?.content;
  expect(Array.isArray(content) && content.length === maxTokens, `chat logprobs.content: ${JSON.stringify(content)}`);
  content.forEach((entry, position) => {
    const where = `chat token ${position} (${JSON.stringify(entry.token)})`;
    expect(typeof entry.token === "string", `${where}: no token text`);
    expectLogprob(entry.logprob, `${where}'s logprob`);
    expectEqual(entry.bytes, [...Buffer.from(entry.token, "utf8")], `${where}: bytes (its UTF-8)`);
    expectEqual(entry.top_logprobs.length, 2, `${where}: alternatives in top_logprobs`);
    entry.top_logprobs.forEach((alternative) => expectLogprob(alternative.logprob, `${where}: a top logprob`));
  });
  expectEqual(content.map((entry) => entry.token).join(""), chatAnswer.choices[0].message.content,
              "the chat tokens' text joined");
  return { line: `${maxTokens} tokens, each the most likely of its top 3; chat entries with token, logprob, bytes` };
}

// 9. Bad requests: the client raises its APIError with status 400 and the
// field at fault; a prompt far past the context is refused before it is
// tokenized, so at once.
async function badRequests(modelId) {
  const request = { model: modelId, prompt, max_tokens: maxTokens };
  await expectApiError("max_tokens -5", () => client.completions.create({ ...request, max_tokens: -5 }), 400,
                       "max_tokens");
  // The client sends fields it does not know as they are (its README,
  // "Undocumented request params"): the server must refuse a typo.
  await expectApiError("an unknown field", () => client.completions.create({ ...request, extra_field: 1 }), 400,
                       "extra_field");
  await expectApiError("n = 1000", () => client.completions.create({ ...request, n: 1000 }), 400, "n");
  const started = performance.now();
  const error = await expectApiError("a prompt past the context",
                                     () => client.completions.create({ ...request, prompt: "x ".repeat(300000) }),
                                     400, "prompt");
  const seconds = (performance.now() - started) / 1000;
  // Refused by the bound on bytes per token, before any tokenizing: the
  // message speaks of bytes (the time is printed, not judged).
  expect(error.code === "context_length_exceeded", `the over-long prompt's code is ${error.code}`);
  expect(/a prompt of 600000 bytes is at least/.test(error.message),
         `the over-long prompt was not refused by the byte bound: ${error.message}`);
  return { line: `400 naming max_tokens, extra_field, n; a 600 kB prompt refused in ${seconds.toFixed(3)} s ` +
                 `(${error.code ?? "no code"})` };
}

// 10. A client that leaves mid-stream: the server drops its request (or
// finishes it first: stories260K on a CPU writes 400 tokens in milliseconds)
// and holds nothing afterwards.
async function disconnect(modelId) {
  const before = await waitUntilIdle(5);
  const stream = await client.completions.create({
    model: modelId, prompt, max_tokens: 400, stream: true,
  });
  let chunks = 0;
  for await (const chunk of stream) {
    expect(chunk.choices.length === 1, `a chunk with ${chunk.choices.length} choices`);
    chunks += 1;
    if (chunks === 2) break;  // leaving the loop aborts the request (the library's stream.controller)
  }
  expectEqual(chunks, 2, "chunks read before leaving");
  stream.controller.abort();  // already done by the break; explicit, as a client that leaves would
  const after = await waitUntilIdle(5);
  const cancelled = after.cancelled - before.cancelled;
  const finished = after.finished - before.finished;
  // The one sample either ran to its end before the server saw the client
  // go, or was cancelled: counted once either way.
  expectEqual(cancelled + finished, 1, `the request's count in /v1/stats (cancelled ${cancelled}, finished ${finished})`);
  return { line: `left after 2 chunks; the server ${cancelled ? "cancelled it" : "had already finished it"}, ` +
                 `no block held` };
}

// After everything: nothing running, waiting or held.
async function idleAtTheEnd() {
  const stats = await serverStats();
  expectEqual([stats.running, stats.waiting, stats.blocks_used], [0, 0, 0], "running, waiting, blocks_used");
  return { line: JSON.stringify(stats) };
}

async function run(name, check, ...inputs) {
  try {
    const { line, result } = await check(...inputs);
    console.log(`ok  ${name}: ${line}`);
    return result;
  } catch (error) {
    // A check's own failure and the client's API errors say what differed;
    // anything else (a bug here, a malformed answer) needs its stack.
    const detail = error instanceof CheckFailed ? error.message
                 : error instanceof OpenAI.APIError ? `${error.constructor.name}: ${error.message}`
                 : error.stack ?? String(error);
    console.error(`FAILED  ${name}: ${detail}`);
    process.exit(1);
  }
}

const modelId = await run("models", models);
const reference = await run("completion", completion, modelId);
await run("completion stream", completionStream, reference);
const chatReference = await run("chat", chat, reference);
await run("chat stream", chatStream, chatReference);
await run("n = 4", severalChoices, modelId);
await run("stop", stop, reference);
await run("logprobs", logprobs, reference);
await run("bad requests", badRequests, modelId);
await run("disconnect", disconnect, modelId);
await run("idle at the end", idleAtTheEnd);
console.log("all OpenAI client checks passed");
