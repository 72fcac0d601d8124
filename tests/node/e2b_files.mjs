// The files side of agentbox's E2B dialect, driven by the stock `e2b` SDK exactly as an agent
// uses it (api_e2b_files_test.cc runs this with E2B_API_URL = E2B_SANDBOX_URL =
// http://127.0.0.1:PORT/e2b and E2B_API_KEY = a daemon token). Prints one line per check,
// "ok <name>" or "FAIL <name>: <why>", and exits non-zero if any failed.
//
// argv[2]: a host path the daemon's box cannot see as itself (an escape target), optional.

import { Sandbox, FileType, FilesystemEventType, NotFoundError, InvalidArgumentError } from 'e2b'

let failed = 0
async function check(name, fn) {
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`)
  }
}
function assert(cond, msg) {
  if (!cond) throw new Error(msg)
}
function eq(got, want, what) {
  const g = JSON.stringify(got)
  const w = JSON.stringify(want)
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`)
}
async function throwsKind(fn, kind, what) {
  try {
    await fn()
  } catch (e) {
    if (!(e instanceof kind)) throw new Error(`${what}: threw ${e && e.name}: ${e && e.message}, want ${kind.name}`)
    return e
  }
  throw new Error(`${what}: did not throw`)
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
const escapeTarget = process.argv[2] || ''

try {
  await check('write_and_read_text', async () => {
    const info = await sbx.files.write('hello.txt', 'hi there\n')
    eq(info.path, '/workspace/hello.txt', 'write path')
    eq(info.name, 'hello.txt', 'write name')
    eq(await sbx.files.read('hello.txt'), 'hi there\n', 'read relative')
    eq(await sbx.files.read('/workspace/hello.txt'), 'hi there\n', 'read absolute')
    // Replacing truncates.
    await sbx.files.write('/workspace/hello.txt', 'short')
    eq(await sbx.files.read('hello.txt'), 'short', 'read after overwrite')
    await sbx.files.write('empty.txt', '')
    eq(await sbx.files.read('empty.txt'), '', 'empty file')
  })

  await check('write_and_read_bytes', async () => {
    const data = new Uint8Array(70000)
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + 3) & 255
    await sbx.files.write('bin/deep/data.bin', data.buffer)
    const back = await sbx.files.read('bin/deep/data.bin', { format: 'bytes' })
    eq(back.length, data.length, 'length')
    assert(back.every((b, i) => b === data[i]), 'bytes differ')
    const blob = await sbx.files.read('bin/deep/data.bin', { format: 'blob' })
    eq(blob.size, data.length, 'blob size')
  })

  await check('write_multiple_files', async () => {
    const infos = await sbx.files.write([
      { path: 'multi/a.txt', data: 'A' },
      { path: '/workspace/multi/b.txt', data: 'BB' },
      { path: 'multi/sub/c.bin', data: new Uint8Array([0, 1, 2, 255]).buffer },
    ])
    eq(infos.map((i) => i.path), ['/workspace/multi/a.txt', '/workspace/multi/b.txt',
      '/workspace/multi/sub/c.bin'], 'paths')
    eq(await sbx.files.read('multi/a.txt'), 'A', 'a')
    eq(await sbx.files.read('multi/b.txt'), 'BB', 'b')
    eq(Array.from(await sbx.files.read('multi/sub/c.bin', { format: 'bytes' })), [0, 1, 2, 255], 'c')
  })

  await check('write_gzip_and_octet_stream', async () => {
    const text = 'compress me '.repeat(5000)
    await sbx.files.write('gz/one.txt', text, { gzip: true })
    eq(await sbx.files.read('gz/one.txt'), text, 'gzip upload')
    await sbx.files.write('gz/two.txt', text, { useOctetStream: true })
    eq(await sbx.files.read('gz/two.txt'), text, 'octet-stream upload')
    const stream = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode('streamed '))
        c.enqueue(new TextEncoder().encode('body'))
        c.close()
      },
    })
    await sbx.files.write('gz/three.txt', stream)
    eq(await sbx.files.read('gz/three.txt'), 'streamed body', 'stream upload')
  })

  await check('list_with_depth', async () => {
    const top = await sbx.files.list('multi')
    eq(top.map((e) => e.name), ['a.txt', 'b.txt', 'sub'], 'names')
    eq(top.map((e) => e.type), [FileType.FILE, FileType.FILE, FileType.DIR], 'types')
    eq(top[1].path, '/workspace/multi/b.txt', 'entry path')
    eq(top[1].size, 2, 'entry size')
    const deep = await sbx.files.list('/workspace/multi', { depth: 2 })
    eq(deep.map((e) => e.path).sort(), ['/workspace/multi/a.txt', '/workspace/multi/b.txt',
      '/workspace/multi/sub', '/workspace/multi/sub/c.bin'], 'depth 2')
  })

  await check('make_dir_and_exists', async () => {
    eq(await sbx.files.makeDir('made/a/b'), true, 'first makeDir')
    eq(await sbx.files.makeDir('made/a/b'), false, 'second makeDir')
    eq(await sbx.files.exists('made/a'), true, 'exists dir')
    eq(await sbx.files.exists('hello.txt'), true, 'exists file')
    eq(await sbx.files.exists('no/such/thing'), false, 'missing')
  })

  await check('rename', async () => {
    await sbx.files.write('ren/from.txt', 'moving')
    const e = await sbx.files.rename('ren/from.txt', 'ren/to/dest.txt')
    eq(e.path, '/workspace/ren/to/dest.txt', 'entry path')
    eq(e.name, 'dest.txt', 'entry name')
    eq(await sbx.files.exists('ren/from.txt'), false, 'source gone')
    eq(await sbx.files.read('ren/to/dest.txt'), 'moving', 'content moved')
    await throwsKind(() => sbx.files.rename('ren/nope', 'ren/x'), NotFoundError, 'missing source')
  })

  await check('get_info', async () => {
    await sbx.files.write('info.txt', '12345')
    const i = await sbx.files.getInfo('info.txt')
    eq(i.name, 'info.txt', 'name')
    eq(i.type, FileType.FILE, 'type')
    eq(i.path, '/workspace/info.txt', 'path')
    eq(i.size, 5, 'size')
    eq(i.permissions, '-rw-r--r--', 'permissions')
    eq(i.mode, 0o644, 'mode')
    eq(i.owner, 'user', 'owner')
    assert(i.modifiedTime instanceof Date && Math.abs(Date.now() - i.modifiedTime.getTime()) < 120000,
      `modifiedTime ${i.modifiedTime}`)
    const d = await sbx.files.getInfo('made')
    eq(d.type, FileType.DIR, 'dir type')
    assert(d.permissions.startsWith('d'), `dir permissions ${d.permissions}`)
    await throwsKind(() => sbx.files.getInfo('nope.txt'), NotFoundError, 'missing')
  })

  await check('remove', async () => {
    await sbx.files.write('rm/tree/x.txt', 'x')
    await sbx.files.remove('rm')
    eq(await sbx.files.exists('rm'), false, 'removed recursively')
    await sbx.files.remove('rm/never-was')  // upstream: a missing path succeeds
  })

  await check('watch_dir', async () => {
    await sbx.files.makeDir('watched')
    const events = []
    const handle = await sbx.files.watchDir('watched', (ev) => events.push(ev), { recursive: true })
    await sbx.files.write('watched/new.txt', 'n')
    await sbx.files.makeDir('watched/sub')
    await sleep(200)
    await sbx.files.write('watched/sub/inner.txt', 'i')
    await sbx.files.rename('watched/new.txt', 'watched/renamed.txt')
    await sbx.files.remove('watched/renamed.txt')
    for (let i = 0; i < 50; i++) {
      if (events.some((e) => e.name === 'renamed.txt' && e.type === FilesystemEventType.REMOVE)) break
      await sleep(100)
    }
    await handle.stop()
    const seen = events.map((e) => `${e.type} ${e.name}`)
    // Writes through the files API are atomic (temp file, then rename): they show as 'create'.
    for (const want of ['create new.txt', 'create sub', 'create sub/inner.txt',
      'rename new.txt', 'create renamed.txt', 'remove renamed.txt']) {
      assert(seen.includes(want), `no '${want}' in ${JSON.stringify(seen)}`)
    }
    assert(!seen.some((s) => s.includes('.agentbox-tmp-')), `temp files reported: ${seen}`)
  })

  await check('bad_input_in_e2b_conventions', async () => {
    await throwsKind(() => sbx.files.read('no-such-file.txt'), NotFoundError, 'read missing')
    await throwsKind(() => sbx.files.read('made'), InvalidArgumentError, 'read a directory')
    await throwsKind(() => sbx.files.list('hello.txt'), InvalidArgumentError, 'list a file')
    await throwsKind(() => sbx.files.list('no/such/dir'), NotFoundError, 'list missing')
    await throwsKind(() => sbx.files.makeDir('hello.txt'), InvalidArgumentError, 'makeDir on a file')
    await throwsKind(() => sbx.files.write('made', 'x'), InvalidArgumentError, 'write over a dir')
    await throwsKind(() => sbx.files.watchDir('hello.txt', () => {}), InvalidArgumentError,
      'watch a file')
  })

  if (escapeTarget) {
    await check('path_escapes_refused', async () => {
      for (const p of [escapeTarget, '../../../../../../' + escapeTarget, 'escape-link/secret']) {
        let content = null
        try {
          content = await sbx.files.read(p)
        } catch (e) {
          continue
        }
        assert(!content.includes('host secret'), `read ${p} reached the host file`)
      }
    })
  }
} finally {
  await sbx.kill()
}
process.exit(failed ? 1 : 0)
