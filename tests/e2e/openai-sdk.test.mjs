// The official `openai` npm SDK against a real `seedbar serve` and the real SmolLM2 model, as a
// Node editor plugin would use it: seeded chat (streamed and not), a JSON schema enforced,
// the Responses API with its stream, and errors as the SDK's own exceptions.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { MOCK, MODEL, ROOT, missing, startServer } from './harness.mjs';

const OpenAI = createRequire(join(ROOT, 'ui/package.json'))('openai');
const ask = (content) => [{ role: 'user', content }];

describe('openai npm SDK', { skip: missing() || MOCK, timeout: 600_000 }, () => {
  let server;
  let client;

  before(async () => {
    server = await startServer();
    client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  });

  after(async () => {
    await server?.stop();
  });

  it('answers a seeded chat, streamed or not, with the same text', async () => {
    const request = { model: MODEL, messages: ask('Name a color.'), seed: 21, temperature: 0.9, max_tokens: 16 };
    const whole = await client.chat.completions.create(request);
    assert.equal(whole.object, 'chat.completion');
    const text = whole.choices[0].message.content;
    assert.ok(text.length > 0);
    let streamed = '';
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      streamed += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.equal(streamed, text);
  });

  it('holds a reply to a JSON schema', async () => {
    const schema = {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, rank: { enum: [1, 2, 3] } },
      required: ['city', 'rank'],
      additionalProperties: false,
    };
    const completion = await client.chat.completions.create({
      model: MODEL, messages: ask('Your favourite city?'), seed: 3, max_tokens: 60, n: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'city', schema, strict: true } },
    });
    for (const choice of completion.choices) {
      const value = JSON.parse(choice.message.content);
      assert.deepEqual(Object.keys(value).sort(), ['city', 'rank']);
      assert.ok([1, 2, 3].includes(value.rank), choice.message.content);
    }
  });

  it('streams a Responses API reply in its event order', async () => {
    const stream = await client.responses.create({ model: MODEL, input: 'Say hello.', max_output_tokens: 8, stream: true });
    const types = [];
    let text = '';
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    assert.equal(types[0], 'response.created');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.join(' '));
    assert.ok(text.length > 0);
  });

  it('raises the SDK\'s errors', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: ask('hi') }), OpenAI.NotFoundError);
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages: ask('hi'), response_format: { type: 'yaml' } }),
      OpenAI.BadRequestError,
    );
  });
});
