export declare const addon: any;
export declare const loadError: Error | null;
