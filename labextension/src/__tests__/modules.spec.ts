/// <reference types="node" />
/**
 * The layout of src/: no TypeScript module over MAX_LINES lines, and no import cycle (a module
 * that imports itself through others, type-only imports included).  The imports are read from
 * each .ts/.tsx file with regular expressions and resolved like TypeScript resolves relative
 * paths; package imports play no part.
 */
import * as fs from 'fs';
import * as path from 'path';

const SRC = path.resolve(__dirname, '..');
const MAX_LINES = 1000;

/** `import … from`, `import type … from`, `export … from`: the clause holds no quote, `;`, `(`, `=`. */
const FROM_RE = /^[ \t]*(?:import|export)\b[^'";()=]*?\bfrom\s*['"]([^'"]+)['"]/gm;
/** `import './x'` (for its effects only). */
const BARE_IMPORT_RE = /^[ \t]*import\s*['"]([^'"]+)['"]/gm;
/** `import('./x')`, `require('./x')`. */
const CALL_RE = /\b(?:import|require)\s*\(\s*['"]([^'"]+)['"]\s*\)/g;

/** The specifiers a module's source imports or re-exports from, in no particular order. */
function importSpecifiers(source: string): string[] {
  const out: string[] = [];
  for (const re of [FROM_RE, BARE_IMPORT_RE, CALL_RE]) {
    for (const m of source.matchAll(re)) {
      out.push(m[1]);
    }
  }
  return out;
}

/** The .ts/.tsx files under `dir`, as paths relative to `root` with `/` separators. */
function sourceFiles(root: string, dir = root): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) {
      out.push(...sourceFiles(root, full));
    } else if (/\.tsx?$/.test(entry.name)) {
      out.push(path.relative(root, full).split(path.sep).join('/'));
    }
  }
  return out.sort();
}

/** The module a relative specifier of `from` names, among `files`; null for packages and others. */
function resolveImport(from: string, specifier: string, files: Set<string>): string | null {
  if (!specifier.startsWith('.')) {
    return null;
  }
  const base = path.posix.normalize(path.posix.join(path.posix.dirname(from), specifier));
  const candidates = ['', '.ts', '.tsx', '.d.ts', '/index.ts', '/index.tsx'].map(s => base + s);
  return candidates.find(c => files.has(c)) ?? null;
}

type Graph = Map<string, string[]>;

/** Each module of `root` and the modules of `root` it imports. */
function importGraph(root: string): Graph {
  const files = sourceFiles(root);
  const known = new Set(files);
  const graph: Graph = new Map();
  for (const file of files) {
    const source = fs.readFileSync(path.join(root, file), 'utf8');
    const targets = importSpecifiers(source)
      .map(s => resolveImport(file, s, known))
      .filter((t): t is string => t !== null);
    graph.set(file, [...new Set(targets)].sort());
  }
  return graph;
}

/**
 * The import cycles of `graph`: one per strongly connected component that holds a cycle (two
 * modules or more, or one that imports itself), as the path `a, b, …, a` from its first module.
 */
function findCycles(graph: Graph): string[][] {
  // Tarjan's strongly connected components.
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const components: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      components.push(component.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) {
    if (!index.has(v)) {
      visit(v);
    }
  }
  const cycles: string[][] = [];
  for (const component of components) {
    const start = component[0];
    if (component.length === 1 && !(graph.get(start) ?? []).includes(start)) {
      continue;
    }
    // The shortest way back to `start` inside the component (breadth first).
    const members = new Set(component);
    const previous = new Map<string, string>();
    const queue = [start];
    let last: string | null = null;
    while (queue.length && last === null) {
      const v = queue.shift()!;
      for (const w of graph.get(v) ?? []) {
        if (w === start) {
          last = v;
          break;
        }
        if (members.has(w) && !previous.has(w)) {
          previous.set(w, v);
          queue.push(w);
        }
      }
    }
    const cycle = [start];
    for (let v = last!; v !== start; v = previous.get(v)!) {
      cycle.splice(1, 0, v);
    }
    cycles.push([...cycle, start]);
  }
  return cycles;
}

function lineCount(source: string): number {
  return source.split('\n').length - (source.endsWith('\n') ? 1 : 0);
}

describe('the module checks themselves', () => {
  it('read every kind of import and re-export, type-only ones too', () => {
    const source = [
      "import * as React from 'react';",
      'import {',
      '  a,',
      '  type B',
      "} from './alpha';",
      "import type { C } from '../beta';",
      "export { d } from './gamma';",
      "export * from './delta';",
      "import './epsilon.css';",
      "const lazy = () => import('./zeta');",
      "export const text = 'words from here';",
      '/** Say where it comes from: */',
      "export function f(x = 1): string { return ['a'].join(''); }"
    ].join('\n');
    expect(importSpecifiers(source).sort()).toEqual(
      ['./alpha', '../beta', './delta', './epsilon.css', './gamma', './zeta', 'react'].sort()
    );
  });

  it('resolve relative paths to the modules that exist', () => {
    const files = new Set(['a.ts', 'b.tsx', 'c/index.ts', 'components/D.tsx', 'svg.d.ts']);
    expect(resolveImport('components/D.tsx', '../a', files)).toBe('a.ts');
    expect(resolveImport('a.ts', './b', files)).toBe('b.tsx');
    expect(resolveImport('a.ts', './c', files)).toBe('c/index.ts');
    expect(resolveImport('a.ts', './components/D', files)).toBe('components/D.tsx');
    expect(resolveImport('a.ts', './svg', files)).toBe('svg.d.ts');
    expect(resolveImport('a.ts', '../style/x.svg', files)).toBeNull();
    expect(resolveImport('a.ts', 'react', files)).toBeNull();
  });

  it('find cycles, long and short, and nothing in a graph without one', () => {
    const graph: Graph = new Map([
      ['a.ts', ['b.ts']],
      ['b.ts', ['c.ts', 'd.ts']],
      ['c.ts', ['a.ts']],
      ['d.ts', []],
      ['e.ts', ['e.ts']],
      ['f.ts', ['a.ts', 'd.ts']]
    ]);
    expect(findCycles(graph)).toEqual([
      ['a.ts', 'b.ts', 'c.ts', 'a.ts'],
      ['e.ts', 'e.ts']
    ]);
    expect(
      findCycles(
        new Map([
          ['a.ts', ['b.ts', 'c.ts']],
          ['b.ts', ['c.ts']],
          ['c.ts', []]
        ])
      )
    ).toEqual([]);
  });
});

describe('the modules of src/', () => {
  const graph = importGraph(SRC);

  it('are found, with their imports', () => {
    expect(graph.get('index.ts')).toEqual(expect.arrayContaining(['sidebar.tsx', 'store.ts']));
  });

  it('import none of themselves through a cycle', () => {
    const cycles = findCycles(graph).map(c => c.join(' -> '));
    expect(cycles).toEqual([]);
  });

  it(`are at most ${MAX_LINES} lines each`, () => {
    const long = [...graph.keys()]
      .map(file => ({ file, lines: lineCount(fs.readFileSync(path.join(SRC, file), 'utf8')) }))
      .filter(f => f.lines > MAX_LINES)
      .map(f => `${f.file}: ${f.lines} lines`);
    expect(long).toEqual([]);
  });
});
