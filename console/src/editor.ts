// The code editor: CodeMirror 6 with Python or JavaScript/TypeScript highlighting.
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { javascript } from "@codemirror/lang-javascript";
import { python } from "@codemirror/lang-python";
import {
  bracketMatching,
  HighlightStyle,
  indentOnInput,
  syntaxHighlighting,
} from "@codemirror/language";
import { Compartment, EditorState } from "@codemirror/state";
import { EditorView, highlightActiveLine, keymap, lineNumbers } from "@codemirror/view";
import { tags } from "@lezer/highlight";

// Colours from styles.css, so that light and dark each keep their contrast.
const highlight = HighlightStyle.define([
  {
    tag: [
      tags.keyword,
      tags.controlKeyword,
      tags.definitionKeyword,
      tags.moduleKeyword,
      tags.operatorKeyword,
    ],
    color: "var(--hl-keyword)",
  },
  { tag: [tags.string, tags.special(tags.string)], color: "var(--hl-string)" },
  { tag: [tags.number, tags.bool, tags.null], color: "var(--hl-number)" },
  {
    tag: [tags.comment, tags.lineComment, tags.blockComment],
    color: "var(--hl-comment)",
    fontStyle: "italic",
  },
  {
    tag: [
      tags.function(tags.variableName),
      tags.function(tags.propertyName),
      tags.definition(tags.variableName),
    ],
    color: "var(--hl-name)",
  },
  { tag: [tags.typeName, tags.className], color: "var(--hl-type)" },
]);

export interface CodeEditor {
  view: EditorView;
  get code(): string;
  set code(text: string);
  setLanguage(language: string): void;
}

const languageOf = (language: string) =>
  language === "python" ? python() : javascript({ typescript: language === "typescript" });

export function createEditor(
  parent: HTMLElement,
  label: string,
  initial: string,
  language: string,
  onRun: () => void,
): CodeEditor {
  const lang = new Compartment();
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc: initial,
      extensions: [
        lineNumbers(),
        history(),
        indentOnInput(),
        bracketMatching(),
        highlightActiveLine(),
        syntaxHighlighting(highlight),
        keymap.of([
          {
            key: "Mod-Enter",
            run: () => {
              onRun();
              return true;
            },
          },
          indentWithTab,
          ...defaultKeymap,
          ...historyKeymap,
        ]),
        lang.of(languageOf(language)),
        EditorView.contentAttributes.of({ "aria-label": label }),
        // The page's CSP admits the editor's <style> element by this nonce, which the gateway
        // puts in the page for each load.
        EditorView.cspNonce.of(
          document.querySelector<HTMLMetaElement>('meta[name="style-nonce"]')?.content ?? "",
        ),
      ],
    }),
  });
  return {
    view,
    get code() {
      return view.state.doc.toString();
    },
    set code(text: string) {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
    },
    setLanguage(language: string) {
      view.dispatch({ effects: lang.reconfigure(languageOf(language)) });
    },
  };
}
