// The builder loads .svg files imported from code as strings.
declare module '*.svg' {
  const value: string;
  export default value;
}
