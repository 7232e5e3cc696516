// pi2-run serve through the official OpenAI client (the npm "openai"
// package), as an application would use it: a whole and a streamed chat
// completion (the same text, greedy), the model list, an unknown model.
// usage: node tests/serve_client.mjs NPM_PREFIX BASE_URL API_KEY MODEL
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [prefix, baseURL, apiKey, model] = process.argv.slice(2);
const mod = path.resolve(prefix, 'node_modules/openai/index.mjs');
const { default: OpenAI } = await import(pathToFileURL(mod).href);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

function check(cond, what) {
  if (!cond) {
    console.error(`serve_client: ${what}`);
    process.exit(1);
  }
}

const messages = [
  { role: 'system', content: 'be brief' },
  { role: 'user', content: 'hello there' },
];
const whole = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
check(whole.object === 'chat.completion', 'object is not chat.completion');
const text = whole.choices[0].message.content;
check(typeof text === 'string', 'no content');
check(whole.usage.completion_tokens > 0, 'no usage');

const stream = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, stream: true });
let streamed = '';
let finish = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
check(streamed === text, `streamed ${JSON.stringify(streamed)} is not ${JSON.stringify(text)}`);
check(finish === 'stop' || finish === 'length', `finish_reason ${finish}`);

const models = [];
for await (const m of client.models.list()) models.push(m.id);
check(models.length === 1 && models[0] === model, `models ${JSON.stringify(models)}`);

try {
  await client.chat.completions.create({ model: 'gpt-9', messages });
  check(false, 'an unknown model was accepted');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, `unknown model: ${e}`);
}
console.log('ok');
